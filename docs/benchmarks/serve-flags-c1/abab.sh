#!/usr/bin/env bash
# served / engine at 1 client: Serve's defaults (A) against its throughput-minded flags (B), ABAB
cd /work/main
export SPECDEC_HOME=/work/main/.specdec
B_ENV="RAY_SERVE_RUN_USER_CODE_IN_SEPARATE_THREAD=0 RAY_SERVE_RUN_ROUTER_IN_SEPARATE_LOOP=0 RAY_SERVE_REQUEST_PATH_LOG_BUFFER_SIZE=1000"
for run in A1 B1 A2 B2; do
  case $run in A*) E="";; B*) E="$B_ENV";; esac
  env $E .venv/bin/python -m bench.batching --prompts 16 --max-tokens 64 --concurrency 1 \
    --repeats 5 --engine --out /work/scratch/tput/$run > /work/scratch/tput/$run.log 2>&1
  python3 -c "import json;r=json.load(open('/work/scratch/tput/$run/result.json'));s=r['summary'];print('$run',{m:round(v['1']['tokens_per_s'],1) for m,v in s.items()}, round(r['goals']['sd_served_c1_over_engine']['value'],3), {m:(round(v['1'].get('target_ms_per_round') or 0,2),round(v['1'].get('rest_ms_per_round') or 0,2)) for m,v in s.items()})" >> /work/scratch/tput/summary.txt
done
