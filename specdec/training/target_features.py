"""Target hidden-state taps and greedy predictions of whole training sequences, on the fly.

One no-grad forward of the frozen target over a batch of sequences gives, at every position t,
the outputs of the tapped layers (the block drafter's context features) and the target's argmax
(its prediction of token t+1, for self-distillation labels). On the runtime backend that is one
ragged pass (as many sequences at a time as the KV pool has free slots); on transformers a
right-padded batch, whose real positions stay exact: attention is causal, so position t never
sees the padding after it.

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
    if target.runtime is not None:
        return runtime_features(target, sequences)
    ids, mask = (t.to(target.device) for t in pad_ids(sequences))
    out = target.model(input_ids=ids, attention_mask=mask, output_hidden_states=True,
                       use_cache=False)
    # hidden_states[0] is the embedding output; layer l's output is hidden_states[l + 1]
    taps = torch.cat([out.hidden_states[layer + 1] for layer in target.tap_layers], dim=-1)
    taps = taps * mask[..., None].to(taps.dtype)
    return SequenceFeatures(taps, out.logits.argmax(-1), mask.sum(-1))


def runtime_features(target: TargetModel, sequences: list[list[int]]) -> SequenceFeatures:
    width, n_taps = max(len(s) for s in sequences), len(target.tap_layers)
    features = torch.zeros(len(sequences), width, n_taps * target.hidden_size, dtype=target.dtype,
                           device=target.device)
    greedy = torch.zeros(len(sequences), width, dtype=torch.long, device=target.device)
    chunk = max(1, len(target.runtime.pool.free))
    for lo in range(0, len(sequences), chunk):
        part = sequences[lo:lo + chunk]
        states = [target.new_state() for _ in part]
        try:
            outs = target.forward_batch(states, part, taps=True)
        finally:
            for state in states:
                target.release(state)
        for i, (seq, out) in enumerate(zip(part, outs, strict=True)):
            features[lo + i, :len(seq)] = out.taps
            greedy[lo + i, :len(seq)] = out.logits.argmax(-1)
    lengths = torch.tensor([len(s) for s in sequences], dtype=torch.long)
    return SequenceFeatures(features, greedy, lengths)
