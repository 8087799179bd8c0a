"""On a CPU with AMX: the int8 linear's tile path against its vpdpbusd path, and both against
the bfloat16 target that ``dtype: auto`` served there before (SmolLM2-135M, 2 threads),
interleaved, medians after warm-ups:

- one projection (1536 x 576, Q4_1) at 1 to 128 rows, on tiles (``amx_rows=1``) and on vpdpbusd
  (``amx_rows=0``), checked bitwise equal;
- whole passes of B requests x T new tokens after 160 cached tokens, and a 100-token prefill:
  ``int8`` (the default: tiles from ``int8.AMX_ROWS`` rows), ``int8_vnni`` (no tiles) and
  ``bf16`` (float32's weights in bfloat16 on oneDNN's AMX kernels, batch invariant).

Writes result.json and result.md next to this file.

    PYTHONPATH=. python docs/benchmarks/amx-int8/passes.py
"""

from __future__ import annotations

import json
import time
from functools import partial
from pathlib import Path

import torch

from bench.passes import cached_forward, interleaved, sweep, timer
from specdec.engine.loading import load_target
from specdec.runtime import int8

HERE = Path(__file__).parent
ROWS = (1, 2, 4, 8, 16, 32, 64, 128)
PASSES = ((1, 1), (1, 4), (4, 1), (8, 1), (4, 4), (8, 4), (16, 1), (16, 4))
TILES = int8.AMX_ROWS


def linear_us(x: torch.Tensor, w: int8.Codes, amx_rows: int) -> float:
    t0 = time.perf_counter()
    for _ in range(20):
        int8.linear(x, w, amx_rows=amx_rows)
    return (time.perf_counter() - t0) / 20 * 1e6


def main() -> None:
    assert int8.amx(), "this CPU has no AMX int8 tiles"
    torch.set_num_threads(2)
    gen = torch.Generator().manual_seed(0)
    blocks = int8.random_blocks("Q4_1", 1536, 576, gen)
    w = int8.pack(blocks, 1536)
    result = {"amx_rows": TILES, "linear_us": []}
    for rows in ROWS:
        x = torch.randn(rows, 576, generator=gen)
        assert torch.equal(int8.linear(x, w, amx_rows=1), int8.linear(x, w, amx_rows=0))
        us = interleaved({"tiles": partial(linear_us, x, w, 1),
                          "vpdpbusd": partial(linear_us, x, w, 0)}, 10, 2)
        result["linear_us"].append({"rows": rows, **us})
        print(result["linear_us"][-1], flush=True)

    targets = {"int8": load_target("smollm2-135m", dtype="float32", kv_slots=1, linears="int8"),
               "bf16": load_target("smollm2-135m", dtype="bfloat16", kv_slots=1)}
    forwards = {"int8": cached_forward(targets["int8"].runtime.w, 160),
                "bf16": cached_forward(targets["bf16"].runtime.w, 160)}
    timed, last = timer(forwards)

    def arm(name: str, rows, crop: int) -> float:  # int8_vnni: the int8 forward without tiles
        int8.AMX_ROWS = 0 if name == "int8_vnni" else TILES
        try:
            return timed("int8" if name == "int8_vnni" else name, rows, crop)
        finally:
            int8.AMX_ROWS = TILES

    def gap() -> float:  # int8 against bfloat16: other numerics
        return max(float((a.logits - b.logits.float()).abs().max())
                   for a, b in zip(last["int8"], last["bf16"], strict=True))

    result |= sweep(arm, ["int8", "int8_vnni", "bf16"], PASSES, (100,), 160, gap)
    (HERE / "result.json").write_text(json.dumps(result, indent=1) + "\n")
    lines = ["One Q4_1 projection, 1536 x 576 (us; tiles bitwise vpdpbusd's):", "",
             "| rows | tiles | vpdpbusd | tiles / vpdpbusd |", "| --- | --- | --- | --- |"]
    lines += [f"| {r['rows']} | {r['tiles']:.1f} | {r['vpdpbusd']:.1f} | "
              f"{r['tiles'] / r['vpdpbusd']:.2f} |" for r in result["linear_us"]]
    lines += ["", f"Whole passes (ms, 160 cached tokens; int8 on tiles from {TILES} rows) and a "
              "prefill:", "", "| pass | int8 | int8, no tiles | bf16 | int8 / no tiles | "
              "int8 / bf16 |", "| --- | --- | --- | --- | --- | --- |"]
    named = [(f"{r['B']} x {r['T']}", r) for r in result["passes_ms"]]
    named += [(f"prefill {r['tokens']}", r) for r in result["prefill_ms"]]
    lines += [f"| {n} | {r['int8']:.1f} | {r['int8_vnni']:.1f} | {r['bf16']:.1f} | "
              f"{r['int8'] / r['int8_vnni']:.2f} | {r['int8'] / r['bf16']:.2f} |" for n, r in named]
    (HERE / "result.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
