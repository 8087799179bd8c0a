"""The training forward of ``BlockDrafterModel``: many blocks of many sequences in one pass.

Inference (``BlockDrafter.propose``) drafts one block from a cached context; training runs N
blocks at once, each attending to its own sequence's context strictly before its anchor
(``BlockBatch.ctx_mask``) and to its own block, never to another block. Both use the same
``BlockDrafterModel.context / context_kv / forward``, so a block trained here is exactly the
block drafted at inference (``tests/training/test_drafter_forward.py`` checks it in float64).

What this is not: no loss, no optimiser (``specdec.algorithms.losses``, ``pipelines``).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from specdec.models.block_drafter import BlockDrafterModel
from specdec.training.block_batches import IGNORE, BlockBatch


@dataclass(frozen=True)
class FrozenTargetParts:
    """The target weights a block drafter borrows, frozen."""

    embedding: torch.Tensor  # [V, H]
    lm_head: torch.Tensor  # [V, H]


def block_hidden(net: BlockDrafterModel, embedding: torch.Tensor, features: torch.Tensor,
                 batch: BlockBatch) -> torch.Tensor:
    """features: [S, T, n*F] target taps of S (padded) sequences -> block hidden [N, B, H]."""
    s, t, _ = features.shape
    ctx = net.context(features.to(embedding.dtype))  # [S, T, H]
    ctx_kv = net.context_kv(ctx, torch.arange(t, device=ctx.device)[None].expand(s, t))  # per layer [S, T, kvh, d]
    per_block = [(k[batch.seq_index], v[batch.seq_index]) for k, v in ctx_kv]  # [N, T, kvh, d]
    n, b = batch.block_pos.shape
    anchor = embedding[batch.anchor_ids].detach()[:, None, :]  # [N, 1, H]
    masks = net.mask_embedding.expand(n, b - 1, -1)  # [N, B-1, H]
    embeds = torch.cat([anchor, masks], dim=1)  # [N, B, H]
    return net(embeds, batch.block_pos, per_block, batch.ctx_mask[:, :t])


def draft_labels(net: BlockDrafterModel, labels: torch.Tensor, valid: torch.Tensor):
    """Map target-vocabulary labels [N, B] to the drafter's (reduced) vocabulary; labels outside
    it become invalid. Returns (labels, valid)."""
    vocab = net.c.vocab_size
    if net.draft_to_target.shape[0] == vocab:
        return labels, valid
    to_draft = torch.full((vocab,), IGNORE, dtype=torch.long, device=labels.device)
    to_draft[net.draft_to_target] = torch.arange(net.draft_to_target.shape[0],
                                                 device=labels.device)
    mapped = torch.where(valid, to_draft[labels.clamp_min(0)], torch.full_like(labels, IGNORE))
    return mapped, valid & (mapped != IGNORE)


def block_logits(net: BlockDrafterModel, parts: FrozenTargetParts, features: torch.Tensor,
                 batch: BlockBatch) -> tuple[torch.Tensor, torch.Tensor]:
    """-> (logits [N, B, V_draft] through the frozen lm_head rows of the draft vocabulary,
    hidden [N, B, H])."""
    hidden = block_hidden(net, parts.embedding, features, batch)
    head = parts.lm_head.detach()[net.draft_to_target]  # [V_draft, H]
    return hidden @ head.T, hidden
