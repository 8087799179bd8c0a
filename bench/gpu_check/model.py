"""Stage (b) of the GPU check: the served target, plain AR against the served default SD.

The target is the named source built from its GGUF (timed), or the tiny target with ``--tiny``
(the suffix drafter then runs without an index: the committed one is SmolLM2's vocabulary). The
SD is what ``make serve`` serves from the serve config, read from the local files as
``cluster.default_pair.serve_args`` reads them from the registry. Per dtype, after a warm-up,
plain AR and SD decode each benchmark prompt in alternating order: their tokens/s, the accepted
length, and where an SD output differs from plain decoding's, the first differing position and
the target's logit margin (top1 - top2) there: a small margin says rounding chose between
near-tied tokens. Not a served (HTTP, Ray) measurement.
"""

from __future__ import annotations

import inspect
import json
import statistics
import time
from pathlib import Path

import torch

from bench.gpu_check import prompts
from bench.gpu_check.report import Context
from bench.gpu_check.tiny import plan_of

SERVED_KNOBS = ("attention", "linears", "kv_cache_dtype", "backend", "max_model_len")


def served(ctx: Context) -> dict:
    """The served default SD of the serve config, from local files (no MLflow)."""
    import yaml

    from cluster.default_pair import PACER_FALLBACK, suffix_args
    from specdec.engine.loading import load_target

    config = yaml.safe_load(Path(ctx.args.serve_config).read_text())
    args = config["applications"][0]["args"]
    pair, kind = Path(config["default_pair"]), config.get("default_drafter", "block")
    pacer_file = pair / "pacer_defaults.json"
    spec = {**args.get("speculative", {}),
            **(json.loads(pacer_file.read_text()) if pacer_file.is_file() else PACER_FALLBACK)}
    refs = {"drafter": str(pair / "drafter"), "preverifier": str(pair / "preverifier"),
            "suffix-index": None if ctx.args.tiny else str(pair / "suffix-index")}
    out = ({**args, **{k: refs[k] for k in ("drafter", "preverifier")}, "speculative": spec}
           if kind == "block" else suffix_args(args, refs, spec, kind, uri="(local files)"))
    knobs = set(inspect.signature(load_target).parameters)
    ctx.keep["served"] = chosen = {
        **{k: out.get(k) for k in ("drafter", "block_drafter", "preverifier", "suffix")},
        "speculative": out["speculative"],
        "target_knobs": {k: args[k] for k in SERVED_KNOBS if k in args and k in knobs}}
    return {"config": ctx.args.serve_config, "default_drafter": kind, **chosen}


def build(ctx: Context) -> dict:
    """The target's weights on disk: the named source built from its GGUF (timed), or tiny."""
    from specdec.models.sources import resolve

    if ctx.args.tiny and "tiny" not in ctx.keep:
        raise RuntimeError("--tiny: the tiny target comes from stage tiny.build, which did not run")
    ref = ctx.keep["tiny"]["target"] if ctx.args.tiny else ctx.args.target
    start = time.monotonic()
    ctx.keep["target"] = path = resolve(ref)
    return {"ref": ref, "path": path, "build_s": round(time.monotonic() - start, 1)}


def engines(ctx: Context, dtype: str):
    """-> (target, plain engine, SD engine) of the served default in ``dtype``."""
    from specdec.engine.engine import Engine
    from specdec.engine.loading import load_drafter, load_preverifier, load_target
    from specdec.models.suffix import SuffixConfig

    s = ctx.keep["served"]
    target = load_target(ctx.keep["target"], s["drafter"], dtype, ctx.args.device,
                         block_drafter=s["block_drafter"], **s["target_knobs"])
    suffix = SuffixConfig(**s["suffix"]) if s["suffix"] else None
    drafter = load_drafter(s["drafter"], target, dtype, suffix, s["block_drafter"],
                           s["preverifier"])
    return target, Engine(target), Engine(target, drafter,
                                          load_preverifier(s["preverifier"], drafter))


def logit_margin(model, ids: list[int]) -> dict:
    """The next token's top two logits after ``ids`` (a full forward, no cache)."""
    device = next(model.parameters()).device
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([ids], device=device)).logits[0, -1].float()
    top = logits.topk(2)
    return {"top1": int(top.indices[0]), "top2": int(top.indices[1]),
            "margin": float(top.values[0] - top.values[1])}


def decode(ctx: Context, dtype: str) -> dict:
    from bench.methods import Method, Prompt, engine_runner, measure

    a, (target, plain, sd) = ctx.args, engines(ctx, dtype)
    sets = prompts.load(a.prompts)
    bench = [Prompt(str(i), "benchmark", ids) for i, ids in enumerate(
        prompts.token_ids(target.tokenizer, sets["benchmark"])[: a.benchmark_prompts])]
    run = {"ar": engine_runner(plain, {}),
           "sd": engine_runner(sd, dict(ctx.keep["served"]["speculative"]))}
    warm = prompts.token_ids(target.tokenizer, sets["train"])[0]
    for runner in run.values():  # kernels, allocator, cuBLAS handles
        runner(warm, a.max_new_tokens)
    # the engine harness's timer: one call at a time, the order alternating from prompt to prompt
    records = measure(bench, [Method("ar", "plain"), Method("sd", "served")], run,
                      a.max_new_tokens, repeats=1, progress=False)
    done = {n: [r for r in records if r.method == n] for n in run}
    speed = {n: statistics.median(len(r.tokens) / r.seconds for r in rs) for n, rs in done.items()}
    differences = []
    for p, x, y in zip(bench, done["ar"], done["sd"], strict=True):
        if x.tokens != y.tokens:
            at = next((j for j, (u, v) in enumerate(zip(x.tokens, y.tokens, strict=False))
                       if u != v), min(len(x.tokens), len(y.tokens)))
            differences.append({"prompt": int(p.id), "position": at, "plain": x.tokens[at: at + 1],
                                "sd": y.tokens[at: at + 1],
                                **logit_margin(target.model, p.ids + x.tokens[:at])})
    rounds = sum(r.stats.rounds for r in done["sd"])
    return {"dtype": dtype, "device": str(target.device), "plan": plan_of(target),
            "prompts": len(bench), "max_new_tokens": a.max_new_tokens,
            "ar_tokens_per_s": round(speed["ar"], 2), "sd_tokens_per_s": round(speed["sd"], 2),
            "sd_vs_ar": round(speed["sd"] / speed["ar"], 3),
            "mean_accepted_length": round(sum(r.stats.committed for r in done["sd"])
                                          / max(1, rounds), 3),
            "equal": len(bench) - len(differences), "of": len(bench), "differences": differences}
