"""Starting points for a block drafter that train faster than a random draft layer.

- ``frequent_tokens``: the reduced draft vocabulary, the ``n`` most frequent label tokens of a
  corpus (plus any tokens that must always be draftable, such as EOS), as EAGLE-3 does. Labels
  outside it cannot be drafted, so the cut trades a little coverage for an lm_head ``V / n``
  times cheaper in every training step and every draft.
- ``copy_target_layer``: the draft layers start as a copy of one target decoder layer (its
  attention, MLP and norms), so training begins from a layer that already reads the target's
  hidden space. Parameters the target layer lacks (q/k norms of a Llama layer) keep their
  identity start.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping

import torch

from specdec.models.block_drafter import BlockDrafterModel
from specdec.models.target import TargetModel

# draft-layer parameter -> the same parameter of an HF Llama/Qwen-style decoder layer
LAYER_MAP = {
    "q_proj": "self_attn.q_proj", "k_proj": "self_attn.k_proj", "v_proj": "self_attn.v_proj",
    "o_proj": "self_attn.o_proj", "q_norm": "self_attn.q_norm", "k_norm": "self_attn.k_norm",
    "input_norm": "input_layernorm", "post_norm": "post_attention_layernorm",
    "gate": "mlp.gate_proj", "up": "mlp.up_proj", "down": "mlp.down_proj",
}


def token_counts(sequences: Iterable[list[int]]) -> Counter:
    return Counter(t for seq in sequences for t in seq)


def frequent_tokens(counts: Mapping[int, int], n: int, always: Iterable[int] = ()) -> torch.Tensor:
    """The ids of the ``n`` most frequent tokens by ``counts``, ``always`` included, sorted; a
    tie goes to the smaller id, so counts summed in any order give the same vocabulary."""
    keep = list(dict.fromkeys(always))
    if n < len(keep):
        raise ValueError(f"draft vocabulary of {n} cannot hold the {len(keep)} required tokens")
    for t in sorted(counts, key=lambda t: (-counts[t], t)):
        if len(keep) == n:
            break
        if t not in keep and counts[t] > 0:
            keep.append(t)
    if len(keep) < n:
        raise ValueError(f"the corpus has only {len(keep)} distinct tokens; draft vocabulary {n}")
    return torch.tensor(sorted(keep), dtype=torch.long)


def copy_target_layer(net: BlockDrafterModel, target: TargetModel, index: int) -> list[str]:
    """Copy target decoder layer ``index`` into every draft layer; return the parameters copied."""
    layers = target.model.model.layers
    if not -len(layers) <= index < len(layers):
        raise ValueError(f"target layer {index} outside its {len(layers)} layers")
    source = dict(layers[index].named_parameters())
    copied = []
    for layer in net.layers:
        for name, param in layer.named_parameters():
            theirs = source.get(f"{LAYER_MAP[name.split('.')[0]]}.{name.split('.', 1)[1]}")
            if theirs is not None and theirs.shape == param.shape:
                with torch.no_grad():
                    param.copy_(theirs.to(param.dtype))
                copied.append(name)
    return sorted(set(copied))
