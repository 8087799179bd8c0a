"""What the target's passes allow the served harness's plain AR: its aggregate tokens/s and p50
latency at ``c`` clients against one, if serving cost nothing but the passes. Not a measurement
of serving (no HTTP, Ray, scheduling or sampling; every step full): read its ratios, not its
tokens/s, against a served run's.

On the passes timer (``bench.passes``), as served (``load_target``'s served numerics, 2 threads):
``decode(c)``, a pass of ``c`` requests x 1 token after ``CONTEXT`` cached ones, and
``joined(P, c)``, a ``P``-token prefill beside ``c - 1`` decodes (a new request joins the running
ones' step). With ``n`` prompts of ``T`` tokens each (the prefill makes the first), at ``c``
clients every prefill runs in a joined step and the other decodes in full steps of ``c``:

    time(c) = sum_i joined(P_i, c) + (n (T - 1) - n (c - 1)) / c * decode(c)
    latency(c) = joined(P, c) + (T - 1) decode(c) + (c - 1) (joined(P, c) - decode(c))

(a request's latency: its own joined step, its decodes, and each other client's prefill joining
one of its steps; ``P`` the median prompt). The aggregate ratio is ``time(1) / time(c)``.

    python -m bench.ceiling --prompts 16 --max-tokens 64 --concurrency 1 2 4 8 16 --out DIR
"""

from __future__ import annotations

import argparse
import statistics
from functools import partial
from pathlib import Path

import torch

from bench import humaneval
from bench.batching import goals, loop_arguments
from bench.passes import Passes, interleaved
from bench.report import command, goal_rows, machine_line, now, write

CONTEXT = 160  # cached tokens of each running request (a 100-token prompt and 60 generated)


def aggregate_time(prompts: list[int], tokens: int, c: int, decode: float,
                   joined: dict[int, float]) -> float:
    """``time(c)`` in the unit of the costs; ``prompts``: token counts."""
    n = len(prompts)
    decodes = n * (tokens - 1) - n * (c - 1)
    return sum(joined[p] for p in prompts) + max(decodes, 0) / c * decode


def latency(prompt: int, tokens: int, c: int, decode: float, joined: float) -> float:
    """``latency(c)`` in the unit of the costs."""
    return joined + (tokens - 1) * decode + (c - 1) * (joined - decode)


def median_prompt(prompts: list[int]) -> int:
    return sorted(prompts)[len(prompts) // 2]  # its request's latency stands for the p50


def ceilings(prompts: list[int], tokens: int, levels: list[int], decode: dict[int, float],
             joined: dict[int, dict[int, float]]) -> dict:
    """Per level the priced time, tokens/s and p50; the served goals of plain AR on them."""
    median = median_prompt(prompts)
    out = {}
    for c in levels:
        t = aggregate_time(prompts, tokens, c, decode[c], joined[c])
        p50 = latency(median, tokens, c, decode[c], joined[c][median])
        out[c] = {"time_ms": t, "tokens_per_s": 1e3 * len(prompts) * tokens / t,
                  "p50_s": p50 / 1e3}
    return {"levels": out, "goals": goals({"ar": out, "sd": {}})}


def measure(target, levels: list[int], lengths: list[int], repeats: int) -> tuple[dict, dict]:
    """decode[c] and joined[c][P] in ms: every pass in turn, the medians of ``repeats``."""
    passes = Passes(target, max(levels), CONTEXT)
    arms = {("decode", c, 0): partial(passes.time, [1] * c) for c in levels}
    arms |= {("joined", c, p): partial(passes.time, [1] * (c - 1), p)
             for c in levels for p in lengths}
    median = interleaved(arms, repeats, 1)
    decode = {c: median["decode", c, 0] for c in levels}
    joined = {c: {p: median["joined", c, p] for p in lengths} for c in levels}
    return decode, joined


def markdown(result: dict) -> str:
    lines = [f"Date {result['date']}, machine: {result['machine']}. Command: `{result['command']}`.",
             f"{len(result['prompt_tokens'])} HumanEval prompts (tokens: median "
             f"{statistics.median(result['prompt_tokens'])}, "
             f"{min(result['prompt_tokens'])}-{max(result['prompt_tokens'])}), "
             f"{result['max_tokens']} new tokens, passes after {CONTEXT} cached tokens, "
             f"medians of {result['repeats']}.", "",
             "| clients | decode pass ms | joined prefill ms (median prompt) | priced AR tok/s "
             "| priced p50 s |", "| --- | --- | --- | --- | --- |"]
    median = median_prompt(result["prompt_tokens"])
    for c, row in result["ceiling"]["levels"].items():
        lines.append(f"| {c} | {result['decode_ms'][c]:.1f} | "
                     f"{result['joined_ms'][c][median]:.1f} | {row['tokens_per_s']:.1f} | "
                     f"{row['p50_s']:.2f} |")
    lines += ["", *goal_rows(result["ceiling"]["goals"], "priced from the passes", "served goal")]
    return "\n".join(lines) + "\n"


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    loop_arguments(ap, repeats=5)
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args(argv)
    if 1 not in args.concurrency:
        raise SystemExit("--concurrency must include 1: the ratios are against one client")
    from specdec.engine.loading import load_target

    torch.set_num_threads(2)  # the served target actor's threads
    target = load_target("smollm2-135m", dtype="auto",  # the served numerics
                         kv_slots=max(args.concurrency) + 1)
    lengths = [len(target.tokenizer(p)["input_ids"]) for p in humaneval.prompts(args.prompts)]
    decode, joined = measure(target, args.concurrency, sorted(set(lengths)), args.repeats)
    result = {"date": now("%Y-%m-%d"), "machine": machine_line(),
              "command": command("bench.ceiling", argv),
              "prompt_tokens": lengths, "max_tokens": args.max_tokens, "repeats": args.repeats,
              "decode_ms": decode, "joined_ms": joined,
              "ceiling": ceilings(lengths, args.max_tokens, args.concurrency, decode, joined)}
    write(args.out, "ceiling", result, markdown(result), indent=1)
    print(markdown(result))


if __name__ == "__main__":
    main()
