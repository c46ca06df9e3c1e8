# Two set-up commands matter to users: `make run` and `make test`. Both create .venv if needed and install
# the locked set in requirements/ (exact versions, hashed): what CI tested is what a user gets.
PY ?= python3.11
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
EXTRAS_STAMP := $(VENV)/.extras
OUT ?= out
LOCKS := requirements
# Optional extras, each locked on its own (requirements/NAME.lock = the main set plus that extra) and tried on
# its own, so one that does not install here skips only its tests.
EXTRAS := cbc cvxpy gurobi ray torch mpi
PIP := $(BIN)/python -m pip install -q --require-hashes
GEN_RPC = $(BIN)/python -m grpc_tools.protoc -I. --python_out=. --grpc_python_out=. --pyi_out=. \
  hpcsched/runtime/proto/*.proto

.PHONY: run test test-fast lint rpc bench venv extras clean horovod lock

$(STAMP): pyproject.toml $(LOCKS)/main.lock
	@command -v $(PY) >/dev/null || { echo "error: $(PY) not found (hpcsched needs Python 3.11)"; exit 2; }
	[ -x $(BIN)/python ] || $(PY) -m venv $(VENV)
	$(PIP) -r $(LOCKS)/main.lock
	$(BIN)/python -m pip install -q --no-deps --no-build-isolation -e .
	$(GEN_RPC)
	touch $(STAMP)

venv: $(STAMP)

$(EXTRAS_STAMP): $(STAMP) $(foreach x,$(EXTRAS),$(LOCKS)/$(x).lock)
	@for x in $(EXTRAS); do \
	  $(PIP) -r $(LOCKS)/$$x.lock || echo "warning: the $$x extra did not install here; its tests will skip"; \
	done
	touch $(EXTRAS_STAMP)

extras: $(EXTRAS_STAMP)

# The gRPC stubs (generated, not committed); works as the first command on a fresh clone.
rpc: $(STAMP)
	$(GEN_RPC)

# Refresh every lock from pyproject.toml's ranges (the newest releases that satisfy them). A deliberate
# change: run the whole suite (`make test`) on the new set before committing it. The extras are resolved
# together first (all-extras.lock, never installed as such) and each extra's lock is cut from that one
# resolution, so extras installed side by side agree on shared packages (cvxpy alone would take a cffi
# that python-mip's CBC crashes with).
COMPILE = $(BIN)/pip-compile -q --all-build-deps --generate-hashes --allow-unsafe --strip-extras \
  --no-emit-index-url --no-emit-find-links
lock: $(STAMP)
	$(COMPILE) --extra dev --upgrade -o $(LOCKS)/main.lock pyproject.toml
	$(COMPILE) --extra dev $(foreach x,$(EXTRAS),--extra $(x)) --upgrade -c $(LOCKS)/main.lock \
	  -o $(LOCKS)/all-extras.lock pyproject.toml
	@for x in $(EXTRAS); do \
	  $(COMPILE) --extra dev --extra $$x -c $(LOCKS)/all-extras.lock -o $(LOCKS)/$$x.lock pyproject.toml || exit 1; \
	done
	cd $(LOCKS) && ../$(BIN)/pip-compile -q --generate-hashes --allow-unsafe --strip-extras --no-emit-index-url \
	  --no-emit-find-links -o horovod.lock horovod.in

# Horovod 0.28.1 as published asks for C++14, torch 2.13 needs C++17: patch its two CMakeLists, build once
# (~7 min on 2 cores) and keep the wheel in a cache outside the clone so later runs only install it.
HOROVOD_VERSION := 0.28.1
WHEEL_CACHE ?= $(HOME)/.cache/hpcsched/wheels
horovod: $(STAMP)
	@set -e; mkdir -p $(WHEEL_CACHE); \
	whl=$$(ls $(WHEEL_CACHE)/horovod-$(HOROVOD_VERSION)-*.whl 2>/dev/null | head -n 1); \
	if [ -z "$$whl" ]; then \
	  $(PIP) -r $(LOCKS)/torch.lock; \
	  tmp=$$(mktemp -d); \
	  $(BIN)/python -m pip download -q --require-hashes --no-deps --no-binary :all: -d $$tmp \
	    -r $(LOCKS)/horovod-src.txt; \
	  tar xzf $$tmp/horovod-$(HOROVOD_VERSION).tar.gz -C $$tmp; src=$$tmp/horovod-$(HOROVOD_VERSION); \
	  sed -i 's/set(CMAKE_CXX_STANDARD 14)/set(CMAKE_CXX_STANDARD 17)/' $$src/CMakeLists.txt $$src/horovod/torch/CMakeLists.txt; \
	  HOROVOD_WITH_PYTORCH=1 HOROVOD_WITH_GLOO=1 HOROVOD_WITH_MPI=1 HOROVOD_WITHOUT_TENSORFLOW=1 \
	    HOROVOD_WITHOUT_MXNET=1 MAKEFLAGS=-j2 \
	    $(BIN)/pip wheel -q --no-build-isolation --no-deps -w $(WHEEL_CACHE) $$src; \
	  rm -rf $$tmp; whl=$$(ls $(WHEEL_CACHE)/horovod-$(HOROVOD_VERSION)-*.whl | head -n 1); \
	fi; \
	$(PIP) -r $(LOCKS)/torch.lock -r $(LOCKS)/horovod.lock; \
	$(BIN)/python -m pip install -q --no-deps "$$whl" && $(BIN)/horovodrun --check-build

# Main job: the bundled real trace (Muri trace3, 992 jobs, 64 GPUs) under every policy; a table and a JCT CDF.
# `make run RUN_COMPAT=muri` gives the reference simulator's accounting (the published table).
RUN_POLICIES ?= fifo,srtf,srsf,las,tiresias,themis,muri-s,muri-l,muri-s+
RUN_COMPAT ?=
run: $(STAMP)
	$(BIN)/hpcsched compare --trace trace-data/muri/trace3.csv --cluster cluster_spec/n8g8.csv \
	  --policies $(RUN_POLICIES) --out $(OUT)/compare $(if $(RUN_COMPAT),--compat $(RUN_COMPAT))

# Random test order (pytest-randomly); the seed is printed so a failing order can be rerun: make test SEED=N.
ifndef SEED
SEED := $(shell od -An -N4 -tu4 /dev/urandom | tr -d ' ')
endif
# Two pytest-xdist workers (CI has 2 cores; most runtime tests wait on heartbeats, not the CPU), a module's tests in
# one worker (module fixtures built once); tests of the live Slurm take turns (a lock, tests/conftest.py). Then the
# tests marked `alone` (they compare real timings with a model) in one process with nothing beside them. Exit
# status 5 (no test selected: PYTEST_ARGS named only one kind) is not a failure. TEST_WORKERS=0 runs the first part in one process too.
PYTEST_ARGS ?=
TEST_WORKERS ?= 2
test: $(STAMP) $(EXTRAS_STAMP)
	@echo "test order: random, seed $(SEED) (rerun this order: make test SEED=$(SEED))"
	$(BIN)/python -m pytest -q -p randomly --randomly-seed=$(SEED) -n $(TEST_WORKERS) --dist loadfile --durations=15 \
	  -m "not alone" $(PYTEST_ARGS) || [ $$? -eq 5 ]
	$(BIN)/python -m pytest -q -p randomly --randomly-seed=$(SEED) -m alone $(PYTEST_ARGS) || [ $$? -eq 5 ]

# For development: everything but the tests marked slow (real Slurm, real training, long runs); CI runs all.
test-fast: $(STAMP)
	@echo "test order: random, seed $(SEED) (rerun this order: make test-fast SEED=$(SEED))"
	$(BIN)/python -m pytest -q -p randomly --randomly-seed=$(SEED) -m "not slow" $(PYTEST_ARGS)

# ruff over everything; mypy over the packages that pass today ([tool.mypy] in pyproject.toml, growing).
lint: $(STAMP)
	$(BIN)/ruff check hpcsched tests bench workloads
	$(BIN)/mypy

bench: $(STAMP)
	@for b in bench/bench_*.py; do echo "== $$b"; $(BIN)/python $$b || exit 1; done

clean:
	rm -rf $(VENV) $(OUT) build *.egg-info
