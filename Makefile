# Two set-up commands matter to users: `make run` and `make test`. Both create .venv if needed.
PY ?= python3.11
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
EXTRAS_STAMP := $(VENV)/.extras
OUT ?= out

.PHONY: run test lint rpc bench venv extras clean

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
	touch $(EXTRAS_STAMP)

extras: $(EXTRAS_STAMP)

rpc: 
	@if ls hpcsched/runtime/proto/*.proto >/dev/null 2>&1; then \
	  $(BIN)/python -m grpc_tools.protoc -I. --python_out=. --grpc_python_out=. --pyi_out=. hpcsched/runtime/proto/*.proto; \
	fi

run: $(STAMP)
	$(BIN)/hpcsched trace inspect trace-data/muri/trace3.csv

test: $(STAMP) $(EXTRAS_STAMP)
	$(BIN)/python -m pytest -q

lint: $(STAMP)
	$(BIN)/ruff check hpcsched tests bench workloads

bench: $(STAMP)
	@for b in bench/bench_*.py; do echo "== $$b"; $(BIN)/python $$b || exit 1; done

clean:
	rm -rf $(VENV) $(OUT) build *.egg-info
