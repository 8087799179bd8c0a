"""The GPU check's command: the stages in order, the report after each (package docstring).

    python -m bench.gpu_check --out DIR [--minutes 7.5] [--prompts FILE]   # one CUDA device
    python -m bench.gpu_check --out DIR --device cpu --tiny                # the CPU dry run

``--minutes`` is the whole run's budget, counted from the start: stage (c) fits its training to
what is left, and a stage that would start with less than its reserve left is skipped. The
process exits 1 when a stage failed (the report says which and why).
"""

from __future__ import annotations

import argparse
import platform
import sys
import time
from pathlib import Path

import torch

from bench.gpu_check import model, tiny, training
from bench.gpu_check.report import REPORT_FILE, Context, Report, Stage

STAGES = (
    Stage("tiny.build", tiny.build),
    Stage("tiny.engine", tiny.engine, ("tiny.build",)),
    Stage("tiny.actors", tiny.actors, ("tiny.engine",)),
    Stage("tiny.train_drafter", tiny.train_drafter, ("tiny.build",)),
    Stage("tiny.train_preverifier", tiny.train_preverifier, ("tiny.build",)),
    Stage("model.served", model.served),
    Stage("model.build", model.build),
    Stage("model.float32", lambda ctx: model.decode(ctx, "float32"),
          ("model.served", "model.build")),
    Stage("model.bfloat16", lambda ctx: model.decode(ctx, "bfloat16"),
          ("model.served", "model.build")),
    Stage("train.responses", training.responses, ("model.build",), reserve_s=90),
    Stage("train.drafter", training.drafter, ("train.responses",), reserve_s=60),
    Stage("train.compare", training.compare, ("train.drafter",), reserve_s=15),
)

TINY_DEFAULTS = dict(max_new_tokens=24, benchmark_prompts=2, response_batch=4,
                     response_tokens=16, train_steps=14, train_batch=2, train_seq_len=256,
                     compare_s=0.0)


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m bench.gpu_check",
                                description="Run specdec's GPU path stage by stage on one device.")
    p.add_argument("--out", required=True, help="folder for gpu_check.json and the run's files")
    p.add_argument("--device", default="cuda", help="cuda (cuda:N), or cpu for a dry run")
    p.add_argument("--tiny", action="store_true",
                   help="stages (b) and (c) on the tiny target instead of SmolLM2 (dry run)")
    p.add_argument("--minutes", type=float, default=7.5, help="the whole run's time budget")
    p.add_argument("--target", default="smollm2-135m", help="the served target (a named source)")
    p.add_argument("--serve-config", default="configs/serve/local.yaml")
    p.add_argument("--committed", default="artifacts/smollm2-135m",
                   help="the committed pair (its drafter/ is compared in stage c)")
    p.add_argument("--prompts", help="prompt sets (python -m bench.gpu_check.prompts); "
                                     "default: a few built in")
    p.add_argument("--only", help="comma-separated stage name prefixes (e.g. tiny,model)")
    p.add_argument("--tiny-tokens", type=int, default=24, help="tokens per tiny request")
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--benchmark-prompts", type=int, default=8)
    p.add_argument("--response-share", type=float, default=0.3,
                   help="share of the time left that stage (c) spends generating responses")
    p.add_argument("--response-batch", type=int, default=64)
    p.add_argument("--response-tokens", type=int, default=256)
    p.add_argument("--train-steps", type=int, default=100_000, help="at most; fitted to time")
    p.add_argument("--train-batch", type=int, default=16)
    p.add_argument("--train-seq-len", type=int, default=512)
    p.add_argument("--compare-s", type=float, default=45.0,
                   help="seconds kept for the accepted-length comparison after training")
    return p


def parse(argv=None) -> argparse.Namespace:
    p = parser()
    args = p.parse_args(argv)
    if args.tiny:  # small sizes unless given
        given = {a.dest for a in p._actions if any(o in (argv or sys.argv[1:])
                                                   for o in a.option_strings)}
        for key, value in TINY_DEFAULTS.items():
            if key not in given:
                setattr(args, key, value)
    if torch.device(args.device).type == "cuda" and not torch.cuda.is_available():
        raise SystemExit(f"gpu_check: --device {args.device}, but torch sees no CUDA device "
                         "(use --device cpu --tiny for the dry run)")
    return args


def header(args: argparse.Namespace, argv) -> dict:
    import transformers

    cuda = torch.device(args.device).type == "cuda"
    return {"command": ["python", "-m", "bench.gpu_check", *(argv or sys.argv[1:])],
            "device": args.device, "gpu": torch.cuda.get_device_name(args.device) if cuda else None,
            "tiny": args.tiny, "minutes": args.minutes, "torch": torch.__version__,
            "cuda": torch.version.cuda, "transformers": transformers.__version__,
            "python": platform.python_version(), "cpus": torch.get_num_threads()}


def main(argv=None) -> dict:
    args = parse(argv)
    start = time.monotonic()
    out = Path(args.out)
    ctx = Context(args, out, deadline=start + 60 * args.minutes)
    report = Report(out / REPORT_FILE, header(args, argv))
    only = tuple(args.only.split(",")) if args.only else None
    for stage in STAGES:
        if only is None or stage.name.startswith(only):
            report.run(stage, ctx)
    failed = [n for n, r in report.data["stages"].items() if r["status"] == "failed"]
    report.finish(seconds=round(time.monotonic() - start, 1), failed=failed)
    print(f"gpu_check: report in {out / REPORT_FILE}; failed: {failed or 'none'}", flush=True)
    if argv is None:  # the command line
        sys.exit(1 if failed else 0)
    return report.data
