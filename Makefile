# Two set-up commands matter to users: `make run` and `make test`. Both create .venv if needed.
PY ?= python3.11
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
EXTRAS_STAMP := $(VENV)/.extras
OUT ?= out

.PHONY: run test lint rpc bench venv extras clean horovod

$(STAMP): pyproject.toml
	@command -v $(PY) >/dev/null || { echo "error: $(PY) not found (hpcsched needs Python 3.11)"; exit 2; }
	[ -x $(BIN)/python ] || $(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[dev]'
	$(MAKE) --no-print-directory rpc
	touch $(STAMP)

venv: $(STAMP)

# Optional extras: each is tried on its own so one that does not install here skips only its tests.
$(EXTRAS_STAMP): $(STAMP)
	-$(BIN)/pip install -q -e '.[cbc]'
	-$(BIN)/pip install -q -e '.[cvxpy]'
	-$(BIN)/pip install -q -e '.[gurobi]'
	-$(BIN)/pip install -q -e '.[ray]'
	-$(BIN)/pip install -q -e '.[torch]'
	-$(BIN)/pip install -q -e '.[mpi]'
	touch $(EXTRAS_STAMP)

extras: $(EXTRAS_STAMP)

rpc: 
	@if ls hpcsched/runtime/proto/*.proto >/dev/null 2>&1; then \
	  $(BIN)/python -m grpc_tools.protoc -I. --python_out=. --grpc_python_out=. --pyi_out=. hpcsched/runtime/proto/*.proto; \
	fi

# Horovod 0.28.1 as published asks for C++14, torch 2.13 needs C++17: patch its two CMakeLists, build once
# (~7 min on 2 cores) and keep the wheel in a cache outside the clone so later runs only install it.
HOROVOD_VERSION := 0.28.1
WHEEL_CACHE ?= $(HOME)/.cache/hpcsched/wheels
horovod: $(STAMP)
	@set -e; mkdir -p $(WHEEL_CACHE); \
	whl=$$(ls $(WHEEL_CACHE)/horovod-$(HOROVOD_VERSION)-*.whl 2>/dev/null | head -n 1); \
	if [ -z "$$whl" ]; then \
	  $(BIN)/pip install -q 'torch==2.13.0' cloudpickle psutil packaging; \
	  tmp=$$(mktemp -d); \
	  $(BIN)/pip download -q --no-deps --no-binary :all: -d $$tmp horovod==$(HOROVOD_VERSION); \
	  tar xzf $$tmp/horovod-$(HOROVOD_VERSION).tar.gz -C $$tmp; src=$$tmp/horovod-$(HOROVOD_VERSION); \
	  sed -i 's/set(CMAKE_CXX_STANDARD 14)/set(CMAKE_CXX_STANDARD 17)/' $$src/CMakeLists.txt $$src/horovod/torch/CMakeLists.txt; \
	  HOROVOD_WITH_PYTORCH=1 HOROVOD_WITH_GLOO=1 HOROVOD_WITH_MPI=1 HOROVOD_WITHOUT_TENSORFLOW=1 \
	    HOROVOD_WITHOUT_MXNET=1 MAKEFLAGS=-j2 \
	    $(BIN)/pip wheel -q --no-build-isolation --no-deps -w $(WHEEL_CACHE) $$src; \
	  rm -rf $$tmp; whl=$$(ls $(WHEEL_CACHE)/horovod-$(HOROVOD_VERSION)-*.whl | head -n 1); \
	fi; \
	$(BIN)/pip install -q "$$whl" && $(BIN)/horovodrun --check-build

# Main job: the bundled real trace (Muri trace3, 992 jobs, 64 GPUs) under every policy; a table and a JCT CDF.
# `make run RUN_COMPAT=muri` gives the reference simulator's accounting (the published table).
RUN_POLICIES ?= fifo,srtf,srsf,las,tiresias,themis,muri-s,muri-l,muri-s+
RUN_COMPAT ?=
run: $(STAMP)
	$(BIN)/hpcsched compare --trace trace-data/muri/trace3.csv --cluster cluster_spec/n8g8.csv \
	  --policies $(RUN_POLICIES) --out $(OUT)/compare $(if $(RUN_COMPAT),--compat $(RUN_COMPAT))

test: $(STAMP) $(EXTRAS_STAMP)
	$(BIN)/python -m pytest -q

lint: $(STAMP)
	$(BIN)/ruff check hpcsched tests bench workloads

bench: $(STAMP)
	@for b in bench/bench_*.py; do echo "== $$b"; $(BIN)/python $$b || exit 1; done

clean:
	rm -rf $(VENV) $(OUT) build *.egg-info
