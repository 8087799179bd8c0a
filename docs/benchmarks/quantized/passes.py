"""The panel linear on GGUF codes against the float32 panels (SmolLM2-135M, 2 threads),
interleaved pass by pass, medians after warm-ups:

- the projections of one pass alone (every layer's four and the lm_head), at 1 to 32 rows: on
  the codes (``qpanels.linear``) and on the float32 panels, which sets ``qpanels.ROWS``;
- whole passes of B requests x T new tokens after 160 cached tokens, and prompt prefills, on
  the runtime with ``linears: auto`` (codes up to ``qpanels.ROWS`` rows, panels past them) and
  ``linears: panels`` (the default before), with the largest logit difference between the two.

Writes result.json and result.md next to this file.

    PYTHONPATH=. python docs/benchmarks/quantized/passes.py
"""

from __future__ import annotations

import json
import time
from functools import partial
from pathlib import Path

import torch

from bench.passes import interleaved, sweep_table, weights_sweep
from specdec.engine.loading import load_target
from specdec.runtime import Weights, panels, qpanels

HERE = Path(__file__).parent
ROWS = (1, 2, 3, 4, 5, 6, 8, 12, 16, 32)
PASSES = ((1, 1), (1, 4), (1, 8), (2, 1), (4, 1), (8, 1), (8, 4), (16, 1))
PROMPTS = (32, 100)
CONTEXT = 160


def linears_ms(projs: list, kind: str, rows: int) -> float:
    inputs = {}
    t0 = time.perf_counter()
    for p in projs:
        x = inputs.setdefault(p.w.shape[1], torch.randn(rows, p.w.shape[1]))
        if kind == "codes":
            qpanels.linear(x, p.codes, p.w.shape[0])
        else:
            panels.linear(x, p.panels, p.w.shape[0])
    return (time.perf_counter() - t0) * 1e3


def main() -> None:
    torch.set_num_threads(2)
    # "auto": auto's pick when this was recorded, the codes to qpanels.ROWS rows (now: quantized)
    target = load_target("smollm2-135m", dtype="float32", kv_slots=1, linears="quantized")
    weights = {"auto": target.runtime.w,
               "panels": Weights.from_hf(target.model, panels=True, quantized=False)}
    projs = weights["auto"].projections()
    assert all(p.codes is not None for p in projs), "the codes do not run here"
    result = {"rows_on_codes": qpanels.ROWS, "linears_ms": []}
    with torch.inference_mode():
        for rows in ROWS:
            ms = interleaved({k: partial(linears_ms, projs, k, rows) for k in ("codes", "panels")},
                             10, 2)
            result["linears_ms"].append({"rows": rows, **ms})
            print(result["linears_ms"][-1], flush=True)
    result |= weights_sweep(weights, PASSES, PROMPTS, CONTEXT)
    (HERE / "result.json").write_text(json.dumps(result, indent=1) + "\n")
    lines = ["Projections of one pass (ms, the layers' four and the lm_head):", "",
             "| rows | codes | float32 panels | codes / panels |", "| --- | --- | --- | --- |"]
    lines += [f"| {r['rows']} | {r['codes']:.1f} | {r['panels']:.1f} | "
              f"{r['codes'] / r['panels']:.2f} |" for r in result["linears_ms"]]
    lines += ["", f"auto runs passes of at most {qpanels.ROWS} rows on the codes.", "",
              *sweep_table(result, "auto", "panels", CONTEXT)]
    (HERE / "result.md").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
