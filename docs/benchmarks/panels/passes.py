"""The float32 panel linear against torch's linears (SmolLM2-135M, 2 threads), interleaved pass
by pass, medians after warm-ups:

- the linears of one pass alone (every layer's four projections, no lm_head), at 1 to 128 rows:
  the panels, oneDNN's packed linear, ``x @ wt`` on the ``[in, out]`` copy, ``F.linear``;
- whole passes of B requests x T new tokens after 160 cached tokens, and prompt prefills, on the
  runtime with ``linears: auto`` (the panels) and ``linears: torch`` (the layout before), with
  the largest logit difference between the two.

Writes result.json and result.md next to this file.

    PYTHONPATH=. python docs/benchmarks/panels/passes.py
"""

from __future__ import annotations

import json
import time
from functools import partial
from pathlib import Path

import torch
import torch.nn.functional as F

from bench.passes import interleaved, sweep_table, weights_sweep
from specdec.engine.loading import load_target
from specdec.runtime import Weights
from specdec.runtime.panels import linear as panel_linear
from specdec.runtime.weights import packed_linear

HERE = Path(__file__).parent
ROWS = (1, 2, 4, 8, 16, 32, 64, 128)
PASSES = ((1, 1), (1, 4), (2, 1), (4, 1), (8, 1), (8, 2), (8, 4), (16, 1), (16, 2))
PROMPTS = (32, 100, 256)
CONTEXT = 160


def linears_ms(projs: list, kind: str, rows: int) -> float:
    inputs = {}
    t0 = time.perf_counter()
    for p in projs:
        x = inputs.setdefault(p.w.shape[1], torch.randn(rows, p.w.shape[1]))
        if kind == "panels":
            panel_linear(x, p.panels, p.w.shape[0])
        elif kind == "onednn_packed":
            packed_linear(x, p.packed, None)
        elif kind == "x @ wt":
            x @ p.wt
        else:
            F.linear(x, p.w)
    return (time.perf_counter() - t0) * 1e3


def main() -> None:
    torch.set_num_threads(2)
    target = load_target("smollm2-135m", dtype="float32", kv_slots=1, linears="panels")
    weights = {"panels": target.runtime.w, "torch": Weights.from_hf(target.model, panels=False)}
    assert weights["panels"].lm_head.panels is not None, "the panel kernel does not run here"
    with_panels, with_torch = (weights[k].projections()[:-1] for k in ("panels", "torch"))
    kinds = {"panels": with_panels, "onednn_packed": with_torch, "x @ wt": with_torch,
             "F.linear": with_torch}
    result = {"linears_ms": []}
    with torch.inference_mode():
        for rows in ROWS:
            ms = interleaved({k: partial(linears_ms, p, k, rows) for k, p in kinds.items()}, 8, 2)
            result["linears_ms"].append({"rows": rows, **ms})
            print(result["linears_ms"][-1], flush=True)
    result |= weights_sweep(weights, PASSES, PROMPTS, CONTEXT)
    (HERE / "result.json").write_text(json.dumps(result, indent=1) + "\n")
    lines = ["Linears of one pass (ms, the layers' four projections):", "",
             "| rows | " + " | ".join(kinds) + " |", "|" + " --- |" * (len(kinds) + 1)]
    lines += [f"| {r['rows']} | " + " | ".join(f"{r[k]:.1f}" for k in kinds) + " |"
              for r in result["linears_ms"]]
    lines += ["", *sweep_table(result, "panels", "torch", CONTEXT)]
    (HERE / "result.md").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
