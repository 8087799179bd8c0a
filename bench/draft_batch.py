"""Drafter-side batching (issue 17): the block drafter's passes for N requests in one batched
call against N calls of one, on a trained block drafter (default: SmolLM2-135M's committed one).

Per N in {1, 4, 8}, requests with different context lengths (``--context`` + 37 i tokens; random
feature rows, the cost does not depend on their values), one torch thread, median of
``--repeats`` after a warm-up, sequential and batched interleaved:
  - block: this round's block pass (``BlockDrafter._forward``: draft layers + draft lm_head);
  - commit: the context k/v of ``--new`` new rows per request (``BlockDrafter._kv``).
Prints one line per (pass, N). Not a test: nothing here asserts a speed.

    python -m bench.draft_batch --drafter artifacts/smollm2-135m/drafter
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from specdec.engine.loading import load_target
from specdec.models.block_drafter import BlockDrafter


def timed(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return (time.perf_counter() - t0) * 1e3


def states(drafter: BlockDrafter, n: int, context: int) -> list:
    """n request states with contexts of context, context + 37, ... tokens."""
    gen = torch.Generator().manual_seed(0)
    width = len(drafter.config.tap_layers) * drafter.config.feature_size
    out = []
    for i in range(n):
        length = context + 37 * i
        prompt = torch.randint(0, drafter.vocab_size, (length,), generator=gen).tolist()
        out.append(drafter.start(prompt, torch.randn(length - 1, width, generator=gen)))
    return out


def compare(name: str, n: int, one_by_one, batched, repeats: int) -> None:
    for _ in range(2):  # warm-up
        one_by_one(), batched()
    seq, bat = [], []
    for _ in range(repeats):
        seq.append(timed(one_by_one))
        bat.append(timed(batched))
    s, b = statistics.median(seq), statistics.median(bat)
    print(f"{name:6s} N={n}: sequential {s:7.2f} ms, batched {b:7.2f} ms, speed-up {s / b:4.2f}x",
          flush=True)


@torch.inference_mode()
def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--drafter", default="artifacts/smollm2-135m/drafter")
    ap.add_argument("--target", default=None, help="default: the drafter's recorded target")
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--context", type=int, default=256)
    ap.add_argument("--new", type=int, default=4, help="new context rows per request (commit)")
    ap.add_argument("--repeats", type=int, default=20)
    args = ap.parse_args()
    torch.set_num_threads(1)
    target_ref = args.target or BlockDrafter.read_config(args.drafter)[1]
    drafter = BlockDrafter.load(args.drafter, load_target(target_ref, args.drafter, args.dtype))
    width = len(drafter.config.tap_layers) * drafter.config.feature_size
    print(f"{target_ref} block drafter, {args.dtype}, block {drafter.config.block_size}, "
          f"draft vocabulary {drafter.head.shape[0]}, 1 thread, median of {args.repeats}")
    for n in (1, 4, 8):
        group = states(drafter, n, args.context)
        compare("block", n, lambda g=group: [drafter._forward([s]) for s in g],
                lambda g=group: drafter._forward(g), args.repeats)
    for n in (1, 4, 8):
        rows = torch.randn(n, args.new, width)
        pos = torch.arange(n * args.new)[None] + args.context

        def one_by_one(rows=rows, pos=pos):
            per_request = zip(rows, pos.view(-1, args.new), strict=True)
            return [drafter._kv(r[None], p[None]) for r, p in per_request]

        compare("commit", n, one_by_one,
                lambda rows=rows, pos=pos: drafter._kv(rows.reshape(1, -1, width), pos),
                args.repeats)


if __name__ == "__main__":
    main()
