"""Load-aware speculation: the cost of a batched target step, and the draft caps it implies.

Two parts, in one run, nothing else running:
  1. the cost table: the runtime's target forward (SmolLM2-135M, the served dtype and torch
     threads, 128 cached tokens per request) for B requests x T new tokens, B in 1..16 and T in
     1..17 (a verify of a k-token draft feeds k + 1), medians over repeats;
  2. the caps: for each batch size B, the draft cap k that maximises the goodput estimate
         B * (1 + sum_{i<k} a_i) / cost(B, 1 + d_k),
     where a_i is the share of rounds that accepted draft position i and d_k = sum_{i<k} r_i the
     mean draft length under the cap (r_i: the share of rounds that drafted position i), both
     read from an engine-benchmark journal (a method's records, e.g. suffix_cold) -- so the cap
     only cuts drafts that would cost more target time than their accepted tokens are worth.
Writes ``draft_caps.json`` (the table, ready for ``batching.draft_caps``), ``costs.png``.

    python -m bench.draft_caps --journal docs/benchmarks/suffix/records.jsonl \
        --method suffix_cold --out docs/benchmarks/batching
"""

from __future__ import annotations

import argparse
import json
import time
from functools import partial
from pathlib import Path

import torch
from tqdm import tqdm

from bench.passes import Passes, interleaved
from bench.report import machine_line, write
from specdec.models.target import TargetModel

BATCHES = (1, 2, 4, 8, 16)
NEW_TOKENS = (1, 2, 3, 5, 9, 17)
CONTEXT = 128


def cost_table(target: str, dtype: str, threads: int, repeats: int) -> dict[int, dict[int, float]]:
    """Seconds of a pass of B requests x T new tokens after ``CONTEXT`` cached ones, on the
    passes harness's timer: the median of ``repeats`` after a warm-up."""
    torch.set_num_threads(threads)
    model = TargetModel.from_pretrained(target, dtype=dtype, backend="runtime",
                                        pool_size=max(BATCHES) + 1)
    passes = Passes(model, max(BATCHES), CONTEXT)
    costs: dict[int, dict[int, float]] = {b: {} for b in BATCHES}
    for b, t in tqdm([(b, t) for b in BATCHES for t in NEW_TOKENS], desc="step costs"):
        costs[b][t] = interleaved({"pass": partial(passes.time, [t] * b)}, repeats, 1)["pass"] / 1e3
    return costs


def acceptance(journal: Path, method: str) -> tuple[list[float], list[float]]:
    """Per draft position: the share of rounds that accepted it and that drafted it."""
    accepted, drafted, rounds = [], [], 0
    for line in journal.read_text().splitlines()[1:]:
        rec = json.loads(line)
        if rec["method"] != method or rec["stats"] is None:
            continue
        s = rec["stats"]
        rounds += s["rounds"]
        for name, into in (("accepted_at", accepted), ("drafted_at", drafted)):
            for i, n in enumerate(s[name]):
                into.extend([0] * (i + 1 - len(into)))
                into[i] += n
    if not rounds:
        raise ValueError(f"{journal} holds no records of method {method!r}")
    return [a / rounds for a in accepted], [d / rounds for d in drafted]


def interpolate(row: dict[int, float], t: float) -> float:
    """Cost at a fractional token count, linear between the measured ones."""
    xs = sorted(row)
    if t <= xs[0]:
        return row[xs[0]]
    for lo, hi in zip(xs, xs[1:], strict=False):
        if t <= hi:
            return row[lo] + (row[hi] - row[lo]) * (t - lo) / (hi - lo)
    return row[xs[-1]] * t / xs[-1]


def best_caps(costs, accepted: list[float], drafted: list[float]) -> dict[int, dict]:
    """Per batch size: the goodput-maximising cap and the estimate for each cap."""
    out = {}
    for b, row in costs.items():
        estimates = {}
        for k in range(1, len(drafted) + 1):
            tokens = 1 + sum(accepted[:k])
            fed = 1 + sum(drafted[:k])
            estimates[k] = b * tokens / interpolate(row, fed)
        best = max(estimates, key=estimates.get)
        out[b] = {"cap": best, "tokens_per_s": estimates}
    return out


def plot(costs, out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    for b, row in costs.items():
        ax.plot(list(row), [1000 * v for v in row.values()], marker="o", label=f"{b} requests")
    ax.set_xlabel("new tokens per request in the step")
    ax.set_ylabel("ms per step (median)")
    ax.set_title("Batched target step cost (SmolLM2-135M runtime)")
    ax.legend()
    fig.tight_layout()
    fig.savefig(out / "costs.png", dpi=120)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--target", default="smollm2-135m")
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--journal", default="docs/benchmarks/suffix/records.jsonl")
    ap.add_argument("--method", default="suffix_cold")
    ap.add_argument("--out", default="docs/benchmarks/batching")
    a = ap.parse_args(argv)
    accepted, drafted = acceptance(Path(a.journal), a.method)
    costs = cost_table(a.target, a.dtype, a.threads, a.repeats)
    caps = best_caps(costs, accepted, drafted)
    out = Path(a.out)
    result = {
        "date": time.strftime("%Y-%m-%d"),
        "machine": machine_line(),
        "command": "python -m bench.draft_caps " + " ".join(argv or []),
        "target": a.target, "dtype": a.dtype, "journal": a.journal, "method": a.method,
        "accepted_share_per_position": accepted, "drafted_share_per_position": drafted,
        "step_seconds": {str(b): {str(t): v for t, v in row.items()} for b, row in costs.items()},
        "goodput_tokens_per_s": {str(b): {str(k): v for k, v in c["tokens_per_s"].items()}
                                 for b, c in caps.items()},
        "draft_caps": {str(b): c["cap"] for b, c in caps.items()},
    }
    write(out, "draft_caps", result)
    plot(costs, out)
    print(json.dumps(result["draft_caps"]))


if __name__ == "__main__":
    main()
