"""Training inputs and labels of the parallel block drafter, built from token sequences.

For one sequence of T tokens ``ids`` and anchors ``a_1..a_N`` (see ``anchors``):

- block input  = [ids[a], MASK x (B-1)] (the drafter embeds the anchor with the frozen target
  embedding and uses its learned MASK embedding for the rest);
- block positions = a, a+1, .., a+B-1 (absolute, for RoPE);
- labels[i, j] = label_seq[a_i + j] for j >= 1, where ``label_seq`` is the sequence itself
  (human text) or the target's greedy predictions (self-distillation, see ``distill_labels``);
- valid[i, j] = j >= 1 and a_i + j < T (column 0 is the anchor and never scored);
- ctx_mask[i, t] = t < a_i.

Several sequences are batched by padding their features to the longest; ``seq_index`` says which
sequence each block belongs to. What this is not: no model forward (see ``drafter_forward``).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from specdec.training.anchors import context_mask

IGNORE = -100  # label at invalid positions


@dataclass(frozen=True)
class BlockBatch:
    anchor_ids: torch.Tensor  # [N] long, the token at each anchor (block input 0)
    block_pos: torch.Tensor  # [N, B] long, absolute positions a..a+B-1
    labels: torch.Tensor  # [N, B] long, IGNORE where not valid
    valid: torch.Tensor  # [N, B] bool, False at j = 0 and past the sequence end
    ctx_mask: torch.Tensor  # [N, T_max] bool, context rows each block may attend to
    seq_index: torch.Tensor  # [N] long, which sequence of the batch a block belongs to

    @property
    def num_blocks(self) -> int:
        return int(self.anchor_ids.shape[0])

    def to(self, device) -> BlockBatch:
        return BlockBatch(*(getattr(self, f).to(device) for f in self.__dataclass_fields__))


def distill_labels(ids: torch.Tensor, greedy_next: torch.Tensor) -> torch.Tensor:
    """Self-distillation labels: ids [T], greedy_next [T] (argmax of the target's logits at t,
    i.e. its prediction for position t+1) -> label_seq [T] with label_seq[t] = greedy_next[t-1]
    (label_seq[0] = ids[0], never used: position 0 is never a label)."""
    return torch.cat([ids[:1], greedy_next[:-1]])


def sequence_blocks(ids: torch.Tensor, anchors: torch.Tensor, block_size: int,
                    label_seq: torch.Tensor | None = None) -> BlockBatch:
    """One sequence: ids [T], anchors [N] -> a BlockBatch with seq_index all 0."""
    t = ids.shape[0]
    if anchors.numel() and (int(anchors.min()) < 1 or int(anchors.max()) >= t):
        raise ValueError(f"anchors must lie in [1, {t - 1}], got {anchors.tolist()}")
    label_seq = ids if label_seq is None else label_seq
    offsets = torch.arange(block_size)  # [B]
    pos = anchors[:, None] + offsets[None, :]  # [N, B]
    valid = (pos < t) & (offsets[None, :] >= 1)  # [N, B]
    labels = torch.where(valid, label_seq[pos.clamp_max(t - 1)], torch.full_like(pos, IGNORE))
    return BlockBatch(anchor_ids=ids[anchors], block_pos=pos, labels=labels, valid=valid,
                      ctx_mask=context_mask(anchors, t),
                      seq_index=torch.zeros(anchors.shape[0], dtype=torch.long))


def concat_blocks(parts: list[BlockBatch]) -> BlockBatch:
    """Batch per-sequence blocks: seq_index becomes the part's index, ctx_mask is padded
    with False to the longest sequence."""
    width = max(p.ctx_mask.shape[1] for p in parts)

    def pad(m: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.pad(m, (0, width - m.shape[1]), value=False)

    return BlockBatch(
        anchor_ids=torch.cat([p.anchor_ids for p in parts]),
        block_pos=torch.cat([p.block_pos for p in parts]),
        labels=torch.cat([p.labels for p in parts]),
        valid=torch.cat([p.valid for p in parts]),
        ctx_mask=torch.cat([pad(p.ctx_mask) for p in parts]),
        seq_index=torch.cat([torch.full_like(p.anchor_ids, i) for i, p in enumerate(parts)]),
    )
