"""The int8 linear (GGUF codes times int8 rows) against the float32 linears it replaced as
auto's pick (SmolLM2-135M, 2 threads), interleaved, medians after warm-ups:

- the projections of one pass alone (every layer's four and the lm_head), at 1 to 128 rows: on
  the int8 kernel (``int8.linear``), on the codes in float32 (``qpanels.linear``, which runs
  passes of up to ``qpanels.ROWS`` rows) and on the float32 panels;
- whole passes of B requests x T new tokens after 160 cached tokens, and prompt prefills, on
  the runtime with ``linears: int8`` (auto's pick here) and ``linears: quantized`` (auto's
  before: bitwise float32), with the largest logit difference between the two.

Writes result.json and result.md next to this file.

    PYTHONPATH=. python docs/benchmarks/int8/passes.py
"""

from __future__ import annotations

import json
import time
from functools import partial
from pathlib import Path

import torch

from bench.passes import interleaved, sweep_table, weights_sweep
from specdec.engine.loading import load_target
from specdec.models import gguf_blocks
from specdec.models.sources import prepare
from specdec.runtime import Weights, int8, panels, qpanels
from specdec.runtime.weights import linear_flags

HERE = Path(__file__).parent
ROWS = (1, 2, 4, 8, 12, 16, 32, 64, 128)
PASSES = ((1, 1), (1, 4), (1, 8), (2, 1), (4, 1), (8, 1), (8, 4), (16, 1))
PROMPTS = (32, 100)
CONTEXT = 160
KINDS = ("int8", "codes", "panels")


def linears_ms(int8s: list, floats: list, kind: str, rows: int) -> float:
    inputs = {}
    t0 = time.perf_counter()
    for q, p in zip(int8s, floats, strict=True):
        out, width = p.w.shape
        x = inputs.setdefault(width, torch.randn(rows, width))
        if kind == "int8":
            int8.linear(x, q.int8)
        elif kind == "codes":
            qpanels.linear(x, p.codes, out)
        else:
            panels.linear(x, p.panels, out)
    return (time.perf_counter() - t0) * 1e3


def cell(row: dict, key: str) -> str:
    return f"{row[key]:.1f}" if key in row else "-"


def main() -> None:
    torch.set_num_threads(2)
    target = load_target("smollm2-135m", dtype="float32", kv_slots=1, linears="int8")
    blocks = gguf_blocks.load(prepare("smollm2-135m"))
    weights = {"int8": target.runtime.w,
               "quantized": Weights.from_hf(target.model, blocks=blocks,
                                            **linear_flags("quantized", blocks=True))}
    int8s, floats = weights["int8"].projections(), weights["quantized"].projections()
    assert all(p.int8 is not None for p in int8s), "the int8 kernel does not run here"
    result = {"linears_ms": []}
    with torch.inference_mode():
        for rows in ROWS:
            kinds = [k for k in KINDS if k != "codes" or rows <= qpanels.ROWS]
            ms = interleaved({k: partial(linears_ms, int8s, floats, k, rows) for k in kinds}, 10, 2)
            result["linears_ms"].append({"rows": rows, **ms})
            print(result["linears_ms"][-1], flush=True)
    result |= weights_sweep(weights, PASSES, PROMPTS, CONTEXT)
    (HERE / "result.json").write_text(json.dumps(result, indent=1) + "\n")
    lines = ["Projections of one pass (ms, the layers' four and the lm_head); the codes in float32 "
             f"run passes of at most {qpanels.ROWS} rows:", "",
             "| rows | int8 | codes (float32) | float32 panels | int8 / float32 panels |",
             "| --- | --- | --- | --- | --- |"]
    lines += [f"| {r['rows']} | {r['int8']:.1f} | {cell(r, 'codes')} | {r['panels']:.1f} | "
              f"{r['int8'] / r['panels']:.2f} |" for r in result["linears_ms"]]
    lines += ["", *sweep_table(result, "int8", "quantized", CONTEXT)]
    (HERE / "result.md").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
