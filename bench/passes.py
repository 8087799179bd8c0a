"""What the pass probes under ``docs/benchmarks/`` share: arms timed in turn, a forward with
rows already cached, and the sweep of whole passes and prompt prefills.

A probe, not a benchmark: it times one ``Forward`` call at a time, with nothing else running,
and says nothing about serving.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence
from functools import partial

import torch

from specdec.runtime import Forward, KVPool, Row, Weights

CACHED = 16  # slots holding a cached context; the next one is the prompts'


def interleaved(arms: dict[str, Callable[[], float]], repeats: int, warm: int) -> dict[str, float]:
    """Each arm (a call returning its time) run in turn, ``warm`` + ``repeats`` times; the
    medians of the last ``repeats``."""
    times = {name: [] for name in arms}
    for i in range(warm + repeats):
        for name, arm in arms.items():
            dt = arm()
            if i >= warm:
                times[name].append(dt)
    return {name: round(statistics.median(t), 3) for name, t in times.items()}


def cached_forward(weights: Weights, context: int, cache: torch.dtype | None = None,
                   **options) -> Forward:
    """A forward whose slots 0..CACHED-1 hold ``context`` cached tokens each, slot CACHED
    taken for prompts; its KV pool in ``cache`` (None: the weights' dtype); ``options``:
    ``Forward``'s."""
    s = weights.shape
    pool = KVPool(s.layers, CACHED + 1, s.kv_heads, s.max_len, s.head_dim,
                  cache or weights.embed.dtype)
    fwd = Forward(weights, pool, **options)
    for _ in range(CACHED):
        fwd([Row(pool.acquire(), list(range(5, 5 + context)), logits_at=[context - 1],
                 chunk=True)])
    pool.acquire()
    return fwd


def timer(forwards: dict[str, Forward]) -> tuple[Callable[[str, list[Row], int], float], dict]:
    """``sweep``'s ``timed`` over these forwards (by arm), and a dict of each arm's last
    outputs, for its ``gap``."""
    last = {}

    def timed(name: str, rows: list[Row], crop: int) -> float:
        fwd = forwards[name]
        t0 = time.perf_counter()
        last[name] = fwd(rows)
        dt = (time.perf_counter() - t0) * 1e3
        for r in rows:
            fwd.pool.crop(r.slot, crop)
        return dt

    return timed, last


def sweep(timed: Callable[[str, list[Row], int], float], arms: Sequence[str],
          passes: Sequence[tuple[int, int]], prompts: Sequence[int], context: int,
          gap: Callable[[], float]) -> dict[str, list[dict]]:
    """Whole passes of B requests x T new tokens after ``context`` cached ones, and prefills
    of each prompt length, every arm in turn: ``timed(arm, rows, crop)`` runs the rows in that
    arm, crops their slots back to ``crop`` and returns its ms; ``gap()`` the largest logit
    difference between the arms' last outputs."""
    out = {"passes_ms": [], "prefill_ms": []}
    with torch.inference_mode():
        for B, T in passes:
            rows = [Row(b, list(range(10, 10 + T)), logits_at=range(T)) for b in range(B)]
            ms = interleaved({a: partial(timed, a, rows, context) for a in arms}, 12, 3)
            out["passes_ms"].append({"B": B, "T": T, **ms, "max_logit_gap": gap()})
            print(out["passes_ms"][-1], flush=True)
        for n in prompts:
            rows = [Row(CACHED, list(range(7, 7 + n)), logits_at=[n - 1], chunk=True)]
            ms = interleaved({a: partial(timed, a, rows, 0) for a in arms}, 6, 2)
            out["prefill_ms"].append({"tokens": n, **ms, "max_logit_gap": gap()})
            print(out["prefill_ms"][-1], flush=True)
    return out


def weights_sweep(weights: dict[str, Weights], passes: Sequence[tuple[int, int]],
                  prompts: Sequence[int], context: int) -> dict[str, list[dict]]:
    """``sweep`` of two arms, one forward on each of the ``weights`` (by arm), the logit gap
    being the largest difference between the two arms' last outputs."""
    forwards = {name: cached_forward(w, context) for name, w in weights.items()}
    timed, last = timer(forwards)
    a, b = forwards

    def gap() -> float:
        return max(float((x.logits - y.logits).abs().max())
                   for x, y in zip(last[a], last[b], strict=True))

    return sweep(timed, list(forwards), passes, prompts, context, gap)


def sweep_table(result: dict, a: str, b: str, context: int) -> list[str]:
    """``sweep``'s passes and prefills as a markdown table of arm ``a`` against arm ``b``."""
    lines = [f"Whole passes (ms, {context} cached tokens) and prefills:", "",
             f"| pass | {a} | {b} | {a} / {b} | max logit gap |", "| --- | --- | --- | --- | --- |"]
    named = [(f"{r['B']} x {r['T']}", r) for r in result["passes_ms"]]
    named += [(f"prefill {r['tokens']}", r) for r in result["prefill_ms"]]
    return lines + [f"| {name} | {r[a]:.1f} | {r[b]:.1f} | {r[a] / r[b]:.2f} | "
                    f"{r['max_logit_gap']:.1e} |" for name, r in named]
