"""Pass times of the batch-invariant runtime (SmolLM2-135M, bfloat16, 2 threads) with each
batch-invariant attention, interleaved pass by pass, medians of 15 after 3 warm-ups; each row
of B requests x T new tokens after a cached context of ``--context`` tokens. Writes
result.json and result.md next to this file.

    PYTHONPATH=. python docs/benchmarks/attention/passes.py --context 128 512
"""

import argparse
import json
import statistics
import time
from pathlib import Path

import torch

from specdec.engine.loading import load_target
from specdec.runtime import Forward, KVPool, Row
from specdec.runtime.model import ATTENTIONS

SHAPES = ((1, 1), (1, 8), (8, 1), (8, 4), (8, 5), (16, 2), (16, 4))
HERE = Path(__file__).parent


def timed(fwd: Forward, B: int, T: int, context: int) -> float:
    """One pass of B requests x T new tokens, then each request cropped back to its context."""
    rows = [Row(b, list(range(10, 10 + T)), logits_at=range(T)) for b in range(B)]
    t0 = time.perf_counter()
    fwd(rows)
    dt = time.perf_counter() - t0
    for b in range(B):
        fwd.pool.crop(b, context)
    return dt


def main(contexts: list[int], repeats: int = 15) -> None:
    torch.set_num_threads(2)
    weights = load_target("smollm2-135m", dtype="bfloat16", kv_slots=1).runtime.w
    s = weights.shape
    forwards = {kind: Forward(weights, KVPool(s.layers, 16, s.kv_heads, s.max_len, s.head_dim,
                                              torch.bfloat16), attention=kind)
                for kind in sorted(ATTENTIONS)}
    results = []
    with torch.inference_mode():
        for context in contexts:
            for fwd in forwards.values():  # 16 requests with this context cached
                for slot in range(16):
                    fwd.pool.release(slot)
                for _ in range(16):
                    slot = fwd.pool.acquire()
                    fwd([Row(slot, list(range(5, 5 + context)), logits_at=[context - 1],
                             chunk=True)])

            for B, T in SHAPES:
                ms = {kind: [] for kind in forwards}
                for i in range(3 + repeats):
                    for kind, fwd in forwards.items():
                        dt = timed(fwd, B, T, context)
                        if i >= 3:
                            ms[kind].append(dt * 1e3)
                row = {"context": context, "rows": B, "tokens": T,
                       **{kind: round(statistics.median(v), 1) for kind, v in ms.items()}}
                print(row, flush=True)
                results.append(row)
    cpu = next(line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo")
               if line.startswith("model name"))
    machine = f"{cpu}, {torch.get_num_threads()} threads, torch {torch.__version__}"
    (HERE / "result.json").write_text(json.dumps({"machine": machine, "passes": results}, indent=1))
    kinds = sorted(forwards)
    lines = [f"Pass times in ms (medians of {repeats}), {machine}:", "",
             "| context | rows x tokens | " + " | ".join(kinds) + " | grouped / per_query |",
             "| --- | --- | " + " | ".join("---" for _ in kinds) + " | --- |"]
    for r in results:
        lines.append(f"| {r['context']} | {r['rows']}x{r['tokens']} | "
                     + " | ".join(f"{r[k]:.1f}" for k in kinds)
                     + f" | {r['grouped'] / r['per_query']:.2f} |")
    (HERE / "result.md").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--context", type=int, nargs="+", default=[128, 512])
    main(ap.parse_args().context)
