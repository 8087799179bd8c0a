"""The passes harness: the target's forward passes timed alone, each arm a way to load it.

A probe, not a benchmark: one ``TargetModel.forward_batch`` at a time, nothing else running,
nothing about serving. It reaches the runtime only through the target's public surface
(``load_target``, ``new_state``, ``forward_batch``, ``crop``), so an arm is a set of
``load_target`` options (``dtype``, ``linears``, ``attention``, ``kv_cache_dtype``) and the same
sweep compares any two ways of running the target:

- whole passes of B requests x T new tokens after ``--context`` cached ones (a batch of decodes
  is T = 1, a verify of a k-token draft T = k + 1);
- prefills of each prompt length alone;

every arm in turn, so the machine's drift falls on all alike, with the largest logit difference
between the arms' last outputs.

    python -m bench.passes --arm 'default={}' --arm 'torch={"linears": "torch"}' \\
        --passes 1x1 8x1 8x4 16x1 --prompts 100 --context 160 --out DIR

``--ceiling N``: what the passes allow the served harness's plain AR on its first ``N`` HumanEval
prompts, its aggregate tokens/s and p50 latency at ``c`` clients against one, if serving cost
nothing but the passes (no HTTP, Ray, scheduling or sampling; every step full: read its ratios,
not its tokens/s, against a served run's). ``decode(c)`` is a pass of ``c`` requests x 1 token
after ``--context`` cached ones, ``joined(P, c)`` a ``P``-token prefill beside ``c - 1`` decodes
(a new request joins the running ones' step). With ``n`` prompts and ``T`` new tokens each (the
prefill makes the first), every prefill runs in a joined step and the other decodes in full steps:

    time(c) = sum_i joined(P_i, c) + (n (T - 1) - n (c - 1)) / c * decode(c)
    latency(c) = joined(P, c) + (T - 1) decode(c) + (c - 1) (joined(P, c) - decode(c))

(a request's latency: its own joined step, its decodes, and each other client's prefill joining
one of its steps; ``P`` the median prompt). The aggregate ratio is ``time(1) / time(c)``.

    python -m bench.passes --ceiling 16 --max-tokens 64 --concurrency 1 2 4 8 16 --out DIR

``--neighbour``: plain decoding (one request, ``--tokens`` one-token passes in a row) alone and
beside one busy process (``python -c "while True: pass"``), every arm in turn in each (each
repeat starts at the next arm), the neighbour started afresh for every repeat; an arm's
``threads`` option is its torch threads.

    python -m bench.passes --neighbour --tokens 256 --repeats 5 --arm 'by_load={}' \
        --arm 'fixed={"threads_by_load": "off"}' --arm 'one={"threads": 1}' --out DIR
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from functools import partial
from pathlib import Path

import torch

from bench.report import command, machine_line, named_json, now, write


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


class Passes:
    """A target with ``running`` requests holding ``context`` cached tokens each, and one more
    request for prompts; ``time`` runs one pass and crops every request back."""

    def __init__(self, target, running: int, context: int):
        self.target, self.context = target, context
        self.states = [target.new_state() for _ in range(running)]
        with torch.inference_mode():
            for s in self.states:
                target.forward(s, list(range(5, 5 + context)), last_logits_only=True)
        self.prompt = target.new_state()
        self.last: list = []

    def time(self, new: Sequence[int], prompt: int = 0) -> float:
        """ms of one pass: ``new[i]`` tokens for running request i (0: not in the pass), and a
        ``prompt``-token prefill beside them when ``prompt`` > 0."""
        states = [s for s, n in zip(self.states, new, strict=False) if n]
        ids = [list(range(10, 10 + n)) for n in new if n]
        last = [False] * len(states)
        if prompt:
            states = [self.prompt, *states]
            vocab = self.target.vocab_size  # a long prompt's ids wrap on a small vocabulary
            ids, last = [[t % vocab for t in range(7, 7 + prompt)], *ids], [True, *last]
        t0 = time.perf_counter()
        with torch.inference_mode():
            self.last = self.target.forward_batch(states, ids, last_logits_only=last)
        dt = (time.perf_counter() - t0) * 1e3
        for s in self.states:
            self.target.crop(s, self.context)
        self.target.crop(self.prompt, 0)
        return dt


def gap(a: list, b: list) -> float:
    """The largest logit difference between two arms' outputs of the same pass."""
    return max(float((x.logits.float() - y.logits.float()).abs().max())
               for x, y in zip(a, b, strict=True))


def sweep(arms: dict[str, Passes], passes: Sequence[tuple[int, int]], prompts: Sequence[int],
          repeats: int = 12, warm: int = 3) -> dict[str, list[dict]]:
    """Every pass and prefill timed in every arm in turn; the medians (ms) and, with two arms
    or more, the largest logit gap of each arm against the first."""
    first, *others = arms

    def row(**shape) -> dict:
        out = {**shape, **interleaved(times, repeats, warm)}
        if others:
            out["max_logit_gap"] = max(gap(arms[first].last, arms[o].last) for o in others)
        print(out, flush=True)
        return out

    result = {"passes_ms": [], "prefill_ms": []}
    for B, T in passes:
        times = {a: partial(p.time, [T] * B) for a, p in arms.items()}
        result["passes_ms"].append(row(B=B, T=T))
    for n in prompts:
        times = {a: partial(p.time, [], n) for a, p in arms.items()}
        result["prefill_ms"].append(row(tokens=n))
    return result


def table(result: dict, names: Sequence[str], context: int) -> list[str]:
    """``sweep``'s passes and prefills as a markdown table, each arm against the first."""
    a, *rest = names
    head = ["pass", *names, *(f"{b} / {a}" for b in rest), *(["max logit gap"] if rest else [])]
    lines = [f"Whole passes (ms, {context} cached tokens) and prefills:", "",
             "| " + " | ".join(head) + " |", "|" + " --- |" * len(head)]
    named = [(f"{r['B']} x {r['T']}", r) for r in result["passes_ms"]]
    named += [(f"prefill {r['tokens']}", r) for r in result["prefill_ms"]]
    for name, r in named:
        cells = [name, *(f"{r[n]:.1f}" for n in names), *(f"{r[b] / r[a]:.2f}" for b in rest)]
        cells += [f"{r['max_logit_gap']:.1e}"] if rest else []
        lines.append("| " + " | ".join(cells) + " |")
    return lines


# ---- the ceiling -----------------------------------------------------------------------------
def aggregate_time(prompts: list[int], tokens: int, c: int, decode: float,
                   joined: dict[int, float]) -> float:
    """``time(c)`` in the unit of the costs; ``prompts``: token counts."""
    decodes = len(prompts) * (tokens - 1) - len(prompts) * (c - 1)
    return sum(joined[p] for p in prompts) + max(decodes, 0) / c * decode


def latency(prompt: int, tokens: int, c: int, decode: float, joined: float) -> float:
    """``latency(c)`` in the unit of the costs."""
    return joined + (tokens - 1) * decode + (c - 1) * (joined - decode)


def ceilings(prompts: list[int], tokens: int, decode: dict[int, float],
             joined: dict[int, dict[int, float]]) -> dict:
    """Per level (the keys of ``decode``) the priced time, tokens/s and p50 (the median
    prompt's request); the served goals of plain AR on them."""
    from bench.batching import goals

    median, out = sorted(prompts)[len(prompts) // 2], {}
    for c in decode:
        t = aggregate_time(prompts, tokens, c, decode[c], joined[c])
        out[c] = {"time_ms": t, "tokens_per_s": 1e3 * len(prompts) * tokens / t,
                  "p50_s": latency(median, tokens, c, decode[c], joined[c][median]) / 1e3,
                  "decode_ms": decode[c], "joined_ms": joined[c][median]}
    return {"levels": out, "goals": goals({"ar": out, "sd": {}})}


def ceiling(target, args) -> tuple[dict, list[str]]:
    """decode(c) and joined(P, c), every pass in turn, priced; -> the result and its table."""
    from bench import humaneval
    from bench.report import goal_rows

    levels = args.concurrency
    if 1 not in levels:
        raise SystemExit("--concurrency must include 1: the ratios are against one client")
    lengths = [len(target.tokenizer(p)["input_ids"]) for p in humaneval.prompts(args.ceiling)]
    passes = Passes(target, max(levels), args.context)
    arms = {("decode", c, 0): partial(passes.time, [1] * c) for c in levels}
    arms |= {("joined", c, p): partial(passes.time, [1] * (c - 1), p)
             for c in levels for p in set(lengths)}
    ms = interleaved(arms, args.repeats, 1)
    priced = ceilings(lengths, args.max_tokens, {c: ms["decode", c, 0] for c in levels},
                      {c: {p: ms["joined", c, p] for p in lengths} for c in levels})
    lines = [f"{len(lengths)} HumanEval prompts of {min(lengths)}-{max(lengths)} tokens, "
             f"{args.max_tokens} new tokens, passes after {args.context} cached tokens, "
             f"medians of {args.repeats}:", "",
             "| clients | decode pass ms | joined prefill ms (median prompt) | priced AR tok/s "
             "| priced p50 s |", "|" + " --- |" * 5]
    lines += [f"| {c} | {r['decode_ms']:.1f} | {r['joined_ms']:.1f} | {r['tokens_per_s']:.1f} | "
              f"{r['p50_s']:.2f} |" for c, r in priced["levels"].items()]
    lines += ["", *goal_rows(priced["goals"], "priced from the passes", "served goal")]
    return {"prompt_tokens": lengths, "max_tokens": args.max_tokens, **priced}, lines


# ---- beside a busy neighbour --------------------------------------------------------------------
def neighbour(args, options: dict[str, dict]) -> tuple[dict, list[str]]:
    """Every arm's plain decoding alone and beside a busy process, in turn; medians."""
    from specdec.engine.loading import load_target

    arms = {}
    for name, o in options.items():
        o = dict(o)
        threads = o.pop("threads", args.threads)
        torch.set_num_threads(threads)
        target = load_target(args.target, **{"dtype": "auto", **o}, kv_slots=2)
        arms[name] = threads, Passes(target, 1, args.context)
    rates = {name: {"alone": [], "beside": []} for name in arms}
    names = list(arms)
    for i in range(args.repeats):
        order = names[i % len(names):] + names[:i % len(names)]  # each arm first in turn
        for where in ("alone", "beside"):
            busy = subprocess.Popen([sys.executable, "-c", "while True: pass"]) \
                if where == "beside" else None
            try:
                time.sleep(0.3 if busy else 0)  # the neighbour's interpreter up and spinning
                for name in order:
                    threads, passes = arms[name]
                    torch.set_num_threads(threads)
                    passes.time([1])
                    ms = sum(passes.time([1]) for _ in range(args.tokens))
                    rates[name][where].append(round(args.tokens * 1e3 / ms, 1))
            finally:
                if busy:
                    busy.kill()
                    busy.wait()
    lines = [f"Plain decoding ({args.tokens} tokens after {args.context} cached ones; medians of "
             f"{args.repeats}), alone and beside one busy process:", "",
             "| arm | threads | passes at 1 / more threads | alone tok/s | beside tok/s | "
             "beside / alone |", "|" + " --- |" * 6]
    rows = []
    for name, (threads, passes) in arms.items():
        alone, beside = (statistics.median(rates[name][w]) for w in ("alone", "beside"))
        governor = passes.target.runtime.governor if passes.target.runtime else None
        split = "-" if governor is None else f"{governor.passes[1]} / {governor.passes[threads]}"
        rows.append({"arm": name, "threads": threads, **rates[name], "alone_tok_s": alone,
                     "beside_tok_s": beside, "ratio": round(beside / alone, 3), "passes": split,
                     "plan": passes.target.plan.describe() if passes.target.plan else None})
        lines.append(f"| {name} | {threads} | {split} | {alone:.1f} | {beside:.1f} | "
                     f"{beside / alone:.2f} |")
    return {"tokens": args.tokens, "context": args.context, "arms": options, "rows": rows}, lines


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--target", default="smollm2-135m")
    ap.add_argument("--arm", action="append", default=[], help="NAME=JSON of load_target options")
    ap.add_argument("--passes", nargs="+", default=["1x1", "8x1", "8x4", "16x1"], help="BxT")
    ap.add_argument("--prompts", type=int, nargs="*", default=[100])
    ap.add_argument("--context", type=int, default=160)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", type=Path)
    ap.add_argument("--repeats", type=int, default=5, help="--ceiling, --neighbour: runs of each")
    ap.add_argument("--neighbour", action="store_true",
                    help="plain decoding alone and beside a busy process, every arm in turn")
    ap.add_argument("--tokens", type=int, default=256, help="--neighbour: tokens a run decodes")
    ap.add_argument("--ceiling", type=int, metavar="N",
                    help="price plain AR's closed loop on the first N HumanEval prompts")
    ap.add_argument("--max-tokens", type=int, default=64, help="--ceiling: tokens a request")
    ap.add_argument("--concurrency", type=int, nargs="+", default=[1, 2, 4, 8, 16],
                    help="--ceiling: clients")
    args = ap.parse_args(argv)
    try:
        options = dict(named_json(a, "--arm") for a in args.arm) or {"default": {}}
    except ValueError as e:
        ap.error(str(e))
    from specdec.engine.loading import load_target

    torch.set_num_threads(args.threads)
    result = {"date": now(), "machine": machine_line(), "command": command("bench.passes", argv)}
    if args.ceiling:  # the served numerics
        target = load_target(args.target, dtype="auto", kv_slots=max(args.concurrency) + 1)
        priced, lines = ceiling(target, args)
        result |= priced
    elif args.neighbour:
        measured, lines = neighbour(args, options)
        result |= measured
    else:
        shapes = [tuple(int(x) for x in p.split("x")) for p in args.passes]
        running = max(b for b, _ in shapes)
        arms = {name: Passes(load_target(args.target, **{"dtype": "auto", **o},
                                         kv_slots=running + 1), running, args.context)
                for name, o in options.items()}
        result |= {"arms": options, **sweep(arms, shapes, args.prompts)}
        lines = table(result, list(arms), args.context)
    md = "\n".join(lines) + "\n"
    print(md, end="")
    if args.out:
        stem = "ceiling" if args.ceiling else "neighbour" if args.neighbour else "passes"
        write(args.out, stem, result, md)


if __name__ == "__main__":
    main()
