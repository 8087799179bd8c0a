#!/bin/bash
# ABBA: today's main (30f88af) against the restructured runtime, served default at 1 and 8 clients
export SPECDEC_HOME=/work/main/.specdec RAY_AUTH_MODE=disabled
run() { # name dir out
  echo "== $1 start $(date +%T)"
  (cd $2 && PYTHONPATH=$2 /work/main/.venv/bin/python -m bench.batching --prompts 16 --max-tokens 64 \
     --concurrency 1 8 --repeats 3 --out $3) > $3.log 2>&1
  echo "== $1 end $(date +%T) rc=$?"
}
run old1 /work/wt-old /tmp/bench/old1
run new1 /work/wt-new /tmp/bench/new1
run new2 /work/wt-new /tmp/bench/new2
run old2 /work/wt-old /tmp/bench/old2
