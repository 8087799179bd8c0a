"""Target hidden-state taps and greedy predictions of whole training sequences, on the fly.

One no-grad forward of the frozen target over a right-padded batch of sequences gives, at every
position t, the outputs of the tapped layers (the block drafter's context features) and the
target's argmax (its prediction of token t+1, for self-distillation labels). Right padding keeps
the real positions exact: attention is causal, so position t never sees the padding after it.

What this is not: no caching, no feature store (taps are 3 x 576 floats per token for SmolLM2;
storing them would cost GBs, recomputing them costs one target forward per step).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from specdec.models.target import TargetModel


@dataclass(frozen=True)
class SequenceFeatures:
    features: torch.Tensor  # [S, T_max, n_taps * F] taps, zeros past each sequence's length
    greedy_next: torch.Tensor  # [S, T_max] long, argmax of the target's logits at each position
    lengths: torch.Tensor  # [S] long


def pad_ids(sequences: list[list[int]], pad: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """-> ids [S, T_max] (right-padded with ``pad``), attention mask [S, T_max] long."""
    width = max(len(s) for s in sequences)
    ids = torch.full((len(sequences), width), pad, dtype=torch.long)
    mask = torch.zeros(len(sequences), width, dtype=torch.long)
    for i, seq in enumerate(sequences):
        ids[i, : len(seq)] = torch.tensor(seq, dtype=torch.long)
        mask[i, : len(seq)] = 1
    return ids, mask


@torch.no_grad()
def sequence_features(target: TargetModel, sequences: list[list[int]]) -> SequenceFeatures:
    if not target.tap_layers:
        raise ValueError("the target taps no layers; build it with the drafter's tap_layers")
    ids, mask = (t.to(target.device) for t in pad_ids(sequences))
    out = target.model(input_ids=ids, attention_mask=mask, output_hidden_states=True,
                       use_cache=False)
    # hidden_states[0] is the embedding output; layer l's output is hidden_states[l + 1]
    taps = torch.cat([out.hidden_states[layer + 1] for layer in target.tap_layers], dim=-1)
    taps = taps * mask[..., None].to(taps.dtype)
    return SequenceFeatures(taps, out.logits.argmax(-1), mask.sum(-1))
