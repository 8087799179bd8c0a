"""Packing simulated decoding steps into pre-verifier training sequences (PACER, arXiv 2602.01274).

A *step* is one round's draft: the drafted tokens in order, each with the drafter's hidden state
[D], its position in the draft, and a label (1 = accepted by the verifier in use, else 0). Many
steps are packed, whole, into sequences of at most ``pack_len`` tokens; ``step_ids`` keeps them
apart (``PreVerifier.forward`` attends causally within a step only). Padding rows carry step id
-1, position 0 and ``valid = False``: real tokens never attend to them (different step id) and
the loss skips them.

What this is not: no Parquet I/O, no training loop (``pipelines.train_preverifier``).
"""

from __future__ import annotations

from dataclasses import dataclass, fields

import torch


@dataclass(frozen=True)
class Step:
    hidden: torch.Tensor  # [k, D] drafter hidden states of the step's k drafted tokens
    labels: torch.Tensor  # [k] float, 1 = accepted


@dataclass(frozen=True)
class PackedSteps:
    hidden: torch.Tensor  # [S, L, D]
    positions: torch.Tensor  # [S, L] long, position of each token in its draft
    step_ids: torch.Tensor  # [S, L] long, -1 on padding
    labels: torch.Tensor  # [S, L] float
    valid: torch.Tensor  # [S, L] bool

    def to(self, device: torch.device | str) -> PackedSteps:
        """These sequences on ``device`` (a trainer's batches live where its model does)."""
        return PackedSteps(*(getattr(self, f.name).to(device) for f in fields(self)))


def pack_order(lengths: list[int], pack_len: int) -> list[list[int]]:
    """Greedy in-order packing: indices of steps per sequence, never splitting a step; each
    sequence holds at most ``pack_len`` tokens."""
    too_long = [n for n in lengths if n > pack_len]
    if too_long:
        raise ValueError(f"a step of {max(too_long)} tokens does not fit pack_len={pack_len}")
    groups: list[list[int]] = []
    used = pack_len
    for i, n in enumerate(lengths):
        if n == 0:
            continue
        if used + n > pack_len:
            groups.append([])
            used = 0
        groups[-1].append(i)
        used += n
    return groups


def pack_steps(steps: list[Step], pack_len: int) -> PackedSteps:
    groups = pack_order([int(s.labels.shape[0]) for s in steps], pack_len)
    d = steps[0].hidden.shape[-1] if steps else 0
    shape = (len(groups), pack_len)
    out = PackedSteps(torch.zeros(*shape, d), torch.zeros(shape, dtype=torch.long),
                      torch.full(shape, -1, dtype=torch.long), torch.zeros(shape),
                      torch.zeros(shape, dtype=torch.bool))
    for row, group in enumerate(groups):
        at = 0
        for i in group:
            k = steps[i].labels.shape[0]
            out.hidden[row, at: at + k] = steps[i].hidden.float()
            out.positions[row, at: at + k] = torch.arange(k)
            out.step_ids[row, at: at + k] = i
            out.labels[row, at: at + k] = steps[i].labels.float()
            out.valid[row, at: at + k] = True
            at += k
    return out
