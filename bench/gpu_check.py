"""Check the engine's GPU path on one CUDA device: lossless in float32, then speed in each dtype.

For each dtype (float32, then bfloat16) the pair is loaded on the GPU and every prompt is decoded
by plain AR (our engine, no drafter), HF ``generate`` greedy, fixed-gamma SD and PACER, methods
rotated from prompt to prompt. Reported per dtype and method: median tokens/s over prompts and
its ratio to AR, mean accepted length, and the share of prompts whose tokens equal AR's. In
float32 every strict method must reproduce AR exactly (the check fails otherwise); in bfloat16
a verify pass of k tokens and a one-token pass may round differently, so equality is reported,
not required.

    python -m bench.gpu_check --drafter DIR --preverifier DIR --prompts benchmark.parquet \\
        --out gpu_check.json

Runs without Ray or MLflow (a bare GPU machine); the models are the same ``specdec`` classes the
Ray actors host.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time

import torch
from tqdm import tqdm

from bench.methods import engine_runner, hf_runner
from pipelines.common.formats import CORPUS_SCHEMA
from pipelines.common.tables import read_table
from specdec.engine.engine import Engine
from specdec.engine.loading import load_pair

METHODS = {  # name -> SpecSettings fields (None: plain AR; "hf": HF generate)
    "ar": None,
    "hf_generate": "hf",
    "fixed_4": {"policy": "fixed", "gamma": 4},
    "fixed_8": {"policy": "fixed", "gamma": 8},
    "fixed_15": {"policy": "fixed", "gamma": 15},
}


def prompts_from(path: str, n: int) -> list[tuple[str, list[int]]]:
    """The first ``n`` prompts of each source (HumanEval, ShareGPT) of a corpus file."""
    rows = read_table(path, CORPUS_SCHEMA, "gpu_check.prompts").to_pylist()
    picked = []
    for source in ("humaneval", "sharegpt"):
        picked += [(r["id"], r["prompt_ids"]) for r in rows if r["source"] == source][:n]
    if not picked:
        raise ValueError(f"{path} has no prompt")
    return picked


def run_dtype(args, dtype: str, prompts, methods: dict) -> dict:
    pair = load_pair(args.target, args.drafter, args.preverifier, dtype=dtype, device=args.device)
    plain = Engine(pair.target)
    spec = Engine(pair.target, pair.drafter, pair.preverifier)
    eos = sorted(pair.target.eos_token_ids)
    runs_of = {name: hf_runner(pair.target.model, eos, {}) if recipe == "hf" else
               engine_runner(plain if recipe is None else spec, recipe or {})
               for name, recipe in methods.items()}

    def call(name: str, ids: list[int]):
        start = time.perf_counter()
        tokens, stats = runs_of[name](ids, args.max_new_tokens)
        return tokens, time.perf_counter() - start, stats

    for name in methods:  # warm-up: kernels, allocator, cuBLAS handles
        call(name, prompts[0][1])
    names = list(methods)
    runs: dict[str, list] = {n: [] for n in names}
    for i, (_, ids) in enumerate(tqdm(prompts, desc=f"gpu_check {dtype}")):
        for name in names[i % len(names):] + names[: i % len(names)]:
            runs[name].append(call(name, ids))
    ar_tokens = [t for t, _, _ in runs["ar"]]
    ar_speed = statistics.median(len(t) / s for t, s, _ in runs["ar"])
    report = {}
    for name, done in runs.items():
        speed = statistics.median(len(t) / s for t, s, _ in done)
        stats = [st for _, _, st in done if st is not None]
        report[name] = {
            "tokens_per_s": round(speed, 1), "vs_ar": round(speed / ar_speed, 3),
            "same_as_ar": sum(t == a for (t, _, _), a in zip(done, ar_tokens, strict=True))
            / len(done),
            "mean_accepted_length": round(sum(s.committed for s in stats)
                                          / max(1, sum(s.rounds for s in stats)), 3)
            if stats else None,
        }
    return report


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--target", default="smollm2-135m")
    parser.add_argument("--drafter", required=True, help="a block-drafter directory")
    parser.add_argument("--preverifier", help="a pre-verifier directory (adds PACER)")
    parser.add_argument("--pacer", default='{"block_size": 2, "threshold": 0.7, "growth": 1.0}',
                        help="PACER settings (JSON)")
    parser.add_argument("--prompts", required=True, help="a corpus Parquet (benchmark split)")
    parser.add_argument("--n", type=int, default=6, help="prompts per source")
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--out", help="write the report here (JSON)")
    parser.add_argument("--device", default="cuda", help="cuda, or cpu for a smoke run")
    parser.add_argument("--methods", help="comma-separated subset (ar is always measured)")
    parser.add_argument("--dtypes", default="float32,bfloat16",
                        help="comma-separated; float32 must be among them (the lossless check)")
    args = parser.parse_args(argv)
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        raise SystemExit("gpu_check: torch sees no CUDA device")
    methods = dict(METHODS)
    if args.preverifier:
        methods["pacer"] = {"policy": "pacer", "max_draft": 15} | json.loads(args.pacer)
    if args.methods:
        keep = {"ar", *args.methods.split(",")}
        unknown = keep - set(methods)
        if unknown:
            raise SystemExit(f"gpu_check: unknown methods {sorted(unknown)}; "
                             f"choose from {sorted(methods)}")
        methods = {m: r for m, r in methods.items() if m in keep}
    prompts = prompts_from(args.prompts, args.n)
    gpu = torch.cuda.get_device_name() if args.device.startswith("cuda") else None
    report = {"device": args.device, "gpu": gpu, "torch": torch.__version__,
              "python": platform.python_version(), "prompts": len(prompts),
              "max_new_tokens": args.max_new_tokens, "methods": methods, "dtypes": {}}
    dtypes = args.dtypes.split(",")
    if "float32" not in dtypes:
        raise SystemExit("gpu_check: --dtypes must include float32 (the lossless check)")
    for dtype in dtypes:
        report["dtypes"][dtype] = run_dtype(args, dtype, prompts, methods)
        print(json.dumps({dtype: report["dtypes"][dtype]}, indent=1), flush=True)
    lossy = [m for m, r in report["dtypes"]["float32"].items()
             if m != "hf_generate" and r["same_as_ar"] < 1.0]
    report["lossless_float32"] = not lossy
    if args.out:
        with open(args.out, "w") as f:
            json.dump(report, f, indent=2)
    if lossy:
        raise SystemExit(f"gpu_check: not lossless in float32 on the GPU: {lossy}")


if __name__ == "__main__":
    main()
