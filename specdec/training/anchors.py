"""Anchor sampling and the block context masks of DFlash-style training (arXiv 2602.06036).

An *anchor* is a position ``a`` of a training sequence that plays the role of the last verified
token: the block drafted from it reads the context features of positions ``0..a-1`` (strictly
before the anchor, as at inference where the anchor's own features are not yet computed) and
predicts the tokens at ``a+1..a+B-1``. Blocks never see each other: each block's attention mask
covers only its own context, and its own block rows are added by the drafter itself.

What this is not: no model, no labels (see ``block_batches``).
"""

from __future__ import annotations

import torch


def anchor_range(length: int, first: int = 1) -> tuple[int, int]:
    """Half-open range [lo, hi) of usable anchors in a sequence of ``length`` tokens: an anchor
    needs one context position before it (a >= 1) and one label after it (a <= T - 2); ``first``
    moves the lower end up (e.g. to the first response token: blocks drafted inside responses
    only, as at inference)."""
    return max(1, first), max(1, length - 1)


def sample_anchors(length: int, num: int, generator: torch.Generator,
                   first: int = 1) -> torch.Tensor:
    """Up to ``num`` distinct anchors, sorted, drawn uniformly from ``anchor_range(length, first)``.

    Returns a long tensor [n] with n = min(num, number of usable anchors)."""
    if num < 1:
        raise ValueError(f"need at least one anchor per sequence, got {num}")
    lo, hi = anchor_range(length, first)
    if hi <= lo:
        return torch.zeros(0, dtype=torch.long)
    picked = torch.randperm(hi - lo, generator=generator)[:num] + lo  # [n]
    return picked.sort().values


def context_mask(anchors: torch.Tensor, length: int) -> torch.Tensor:
    """ctx_mask[i, t] = t < anchors[i]: block i sees the context strictly before its anchor.

    anchors: [N] long -> [N, length] bool."""
    return torch.arange(length)[None, :] < anchors[:, None]


def context_mask_reference(anchors: list[int], length: int) -> list[list[bool]]:
    """Slow restatement of :func:`context_mask`, for tests and reading."""
    return [[t < a for t in range(length)] for a in anchors]
