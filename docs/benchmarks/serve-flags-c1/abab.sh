#!/usr/bin/env bash
# Served / engine at 1 client: Serve's defaults (A) against three of its throughput flags (B),
# in turn A B A B; each run's result.json / result.md land beside this script.
set -euo pipefail
cd "$(dirname "$0")/../../.."
here=docs/benchmarks/serve-flags-c1
flags="RAY_SERVE_RUN_USER_CODE_IN_SEPARATE_THREAD=0 RAY_SERVE_RUN_ROUTER_IN_SEPARATE_LOOP=0
RAY_SERVE_REQUEST_PATH_LOG_BUFFER_SIZE=1000"
for run in A1 B1 A2 B2; do
  case $run in A*) vars=();; B*) read -r -d '' -a vars <<< "$flags" || true;; esac
  env "${vars[@]}" .venv/bin/python -m bench.batching --prompts 16 --max-tokens 64 \
    --concurrency 1 --repeats 5 --engine --out "$here/$run"
done
