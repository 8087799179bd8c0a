"""The GPU check's command: the stages in order, the report after each.

    python -m bench.gpu_check --out DIR [--minutes 7.5] [--prompts FILE]   # one CUDA device
    python -m bench.gpu_check --out DIR --device cpu --tiny                # the CPU dry run

``--minutes`` is the whole run's budget from its start: stage (c) fits its training to what is
left, and a stage that would start with less than its reserve left is skipped. ``--tiny`` runs
stages (b) and (c) on the tiny target, at ``TINY`` sizes. Exits 1 when a stage failed.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

from bench.gpu_check import model, tiny, training
from bench.gpu_check.report import REPORT_FILE, Context, Report, Stage
from bench.report import command, machine

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
# the sizes of a run: tokens a tiny request, a benchmark request, a response; prompts timed;
# responses a batch; training steps (at most: fitted to the time), batch and sequence length
SIZES = dict(tiny_tokens=24, max_new_tokens=128, benchmark_prompts=8, response_share=0.3,
             response_batch=64, response_tokens=256, train_steps=100_000, train_batch=16,
             train_seq_len=512)
TINY = SIZES | dict(max_new_tokens=24, benchmark_prompts=2, response_batch=4,
                    response_tokens=16, train_steps=14, train_batch=2, train_seq_len=256)


def parse(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench.gpu_check",
                                description="Run specdec's GPU path stage by stage on one device.")
    p.add_argument("--out", required=True, help="folder for gpu_check.json and the run's files")
    p.add_argument("--device", default="cuda", help="cuda (cuda:N), or cpu for a dry run")
    p.add_argument("--tiny", action="store_true",
                   help="stages (b) and (c) on the tiny target, small sizes (dry run)")
    p.add_argument("--minutes", type=float, default=7.5, help="the whole run's time budget")
    p.add_argument("--target", default="smollm2-135m", help="the served target (a named source)")
    p.add_argument("--serve-config", default="configs/serve/local.yaml")
    p.add_argument("--committed", default="artifacts/smollm2-135m",
                   help="the committed pair (its drafter/ is compared in stage c)")
    p.add_argument("--prompts", help="prompt sets (python -m bench.gpu_check.prompts); "
                                     "default: a few built in")
    p.add_argument("--only", help="comma-separated stage name prefixes (e.g. tiny,model)")
    p.add_argument("--compare-s", type=float,
                   help="seconds kept for the accepted-length comparison after training "
                        "(default 45; 0 with --tiny)")
    args = p.parse_args(argv)
    vars(args).update(TINY if args.tiny else SIZES)
    if args.compare_s is None:
        args.compare_s = 0.0 if args.tiny else 45.0
    if torch.device(args.device).type == "cuda" and not torch.cuda.is_available():
        raise SystemExit(f"gpu_check: --device {args.device}, but torch sees no CUDA device "
                         "(use --device cpu --tiny for the dry run)")
    return args


def main(argv=None) -> dict:
    args, start = parse(argv), time.monotonic()
    out = Path(args.out)
    ctx = Context(args, out, deadline=start + 60 * args.minutes)
    report = Report(out / REPORT_FILE, {"command": command("bench.gpu_check", argv),
                                        "device": args.device, "tiny": args.tiny,
                                        "minutes": args.minutes, "machine": machine(args.device)})
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
