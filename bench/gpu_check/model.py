"""Stage (b) of the GPU check: the served target, plain AR against the served default SD.

The target is the named source ``smollm2-135m``, built from its GGUF on the machine (the build is
timed), or the tiny target with ``--tiny``. The SD is what ``make serve`` serves from the serve
config (``configs/serve/local.yaml``): its ``default_drafter`` over its ``default_pair``
directory, read from the local files as ``cluster.default_pair.serve_args`` would read them from
the registry (suffix and hybrid: ``suffix_args``; block: the block drafter with PACER), with the
target's ``attention`` / ``linears`` / ``kv_cache_dtype`` as served. With ``--tiny`` the suffix
drafter runs without an index (the committed one is SmolLM2's vocabulary).

For each dtype (float32, bfloat16), one target serves both engines; after a warm-up on a prompt
outside the set, every benchmark prompt is decoded greedily by plain AR and by SD, the order
alternating from prompt to prompt. Reported: median tokens/s of each, their ratio, the mean
accepted length, how many SD outputs equal plain decoding's, and for each that does not, the
first differing position and the target's logit margin there (top1 - top2 of a full HF forward
of the prompt and plain decoding's tokens before it): a small margin says the two paths' rounding
chose between near-tied tokens.

What it is not: a served (HTTP, Ray) measurement, or a benchmark of record.
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

# passed to the target as served
SERVED_KNOBS = ("attention", "linears", "kv_cache_dtype", "backend", "max_model_len")


def served(ctx: Context) -> dict:
    """The served default SD of the serve config, from local files (no MLflow)."""
    import yaml

    from cluster.default_pair import PACER_FALLBACK, suffix_args

    config = yaml.safe_load(Path(ctx.args.serve_config).read_text())
    args = config["applications"][0]["args"]
    pair, kind = Path(config["default_pair"]), config.get("default_drafter", "block")
    pacer_file = pair / "pacer_defaults.json"
    spec = {**args.get("speculative", {}),
            **(json.loads(pacer_file.read_text()) if pacer_file.is_file() else PACER_FALLBACK)}
    refs = {"drafter": str(pair / "drafter"), "preverifier": str(pair / "preverifier"),
            "suffix-index": None if ctx.args.tiny else str(pair / "suffix-index")}
    if kind == "block":
        out = {**args, "drafter": refs["drafter"], "preverifier": refs["preverifier"],
               "speculative": spec}
    else:
        out = suffix_args(args, refs, spec, kind, uri="(local files)")
    knobs = set(inspect.signature(load_target_fn()).parameters)
    chosen = {"drafter": out["drafter"], "block_drafter": out.get("block_drafter"),
              "preverifier": out.get("preverifier"), "suffix": out.get("suffix"),
              "speculative": out["speculative"],
              "target_knobs": {k: args[k] for k in SERVED_KNOBS if k in args and k in knobs}}
    ctx.keep["served"] = chosen
    return {"config": ctx.args.serve_config, "default_drafter": kind, **chosen}


def load_target_fn():
    from specdec.engine.loading import load_target

    return load_target


def build(ctx: Context) -> dict:
    """The target's weights on disk: the named source built from its GGUF (timed), or tiny."""
    from specdec.models.sources import resolve

    if ctx.args.tiny and "tiny" not in ctx.keep:
        raise RuntimeError("--tiny: the tiny target comes from stage tiny.build, which did not run")
    ref = ctx.keep["tiny"]["target"] if ctx.args.tiny else ctx.args.target
    start = time.monotonic()
    path = resolve(ref)
    ctx.keep["target"] = path
    return {"ref": ref, "path": path, "build_s": round(time.monotonic() - start, 1)}


def engines(ctx: Context, dtype: str):
    """-> (target, plain engine, SD engine) of the served default in ``dtype``."""
    from specdec.engine.engine import Engine
    from specdec.engine.loading import load_drafter, load_preverifier
    from specdec.models.suffix import SuffixConfig

    s = ctx.keep["served"]
    target = load_target_fn()(ctx.keep["target"], s["drafter"], dtype, ctx.args.device,
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
    from specdec.engine.settings import GenerationParams, SpecSettings

    target, plain, sd = engines(ctx, dtype)
    sets = prompts.load(ctx.args.prompts)
    bench = prompts.token_ids(target.tokenizer, sets["benchmark"])[: ctx.args.benchmark_prompts]
    spec = dict(ctx.keep["served"]["speculative"])
    params = {"ar": GenerationParams(max_new_tokens=ctx.args.max_new_tokens),
              "sd": GenerationParams(max_new_tokens=ctx.args.max_new_tokens,
                                     spec=SpecSettings(spec.pop("policy", "fixed"), **spec))}
    runs = {"ar": plain, "sd": sd}
    warm = prompts.token_ids(target.tokenizer, sets["train"])[0]
    for name in runs:  # kernels, allocator, cuBLAS handles
        runs[name].generate(warm, params[name])
    done: dict[str, list] = {"ar": [], "sd": []}
    for i, ids in enumerate(bench):
        for name in (("ar", "sd") if i % 2 == 0 else ("sd", "ar")):
            if device_is_cuda(ctx):
                torch.cuda.synchronize()
            start = time.perf_counter()
            out = runs[name].generate(ids, params[name])
            done[name].append((out, time.perf_counter() - start))
    speed = {n: statistics.median(len(o.token_ids) / s for o, s in done[n]) for n in done}
    differences = []
    for i, (ids, (a, _), (b, _)) in enumerate(zip(bench, done["ar"], done["sd"], strict=True)):
        if a.token_ids != b.token_ids:
            at = first_difference(a.token_ids, b.token_ids)
            differences.append({"prompt": i, "position": at,
                                "plain": a.token_ids[at: at + 1], "sd": b.token_ids[at: at + 1],
                                **logit_margin(target.model, ids + a.token_ids[:at])})
    rounds = sum(o.stats.rounds for o, _ in done["sd"])
    return {"dtype": dtype, "device": str(target.device), "plan": plan_of(target),
            "prompts": len(bench), "max_new_tokens": ctx.args.max_new_tokens,
            "ar_tokens_per_s": round(speed["ar"], 2), "sd_tokens_per_s": round(speed["sd"], 2),
            "sd_vs_ar": round(speed["sd"] / speed["ar"], 3),
            "mean_accepted_length": round(sum(o.stats.committed for o, _ in done["sd"])
                                          / max(1, rounds), 3),
            "equal": len(bench) - len(differences), "of": len(bench),
            "differences": differences}


def first_difference(a: list[int], b: list[int]) -> int:
    """The first position where ``a`` and ``b`` differ (one may stop early: its length)."""
    return next((j for j, (x, y) in enumerate(zip(a, b, strict=False)) if x != y),
                min(len(a), len(b)))


def device_is_cuda(ctx: Context) -> bool:
    return torch.device(ctx.args.device).type == "cuda"
