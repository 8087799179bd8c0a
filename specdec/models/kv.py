"""Thin helpers over HF's DynamicCache, so the rest of specdec speaks in absolute lengths."""

from __future__ import annotations

import torch
from transformers import DynamicCache


def new_cache(config) -> DynamicCache:
    return DynamicCache(config=config)


def crop_cache(cache: DynamicCache, length: int) -> None:
    """Keep the first ``length`` cached positions (HF's crop takes minus the count to drop)."""
    drop = cache.get_seq_length() - length
    if drop < 0:
        raise ValueError(f"cannot crop a cache of {cache.get_seq_length()} positions to {length}")
    if drop:
        cache.crop(-drop)


def cached_forward(model, ids: list[int], cache: DynamicCache, hidden: bool = False):
    """One forward of ``ids`` appended to ``cache`` (extended in place)."""
    input_ids = torch.tensor([ids], dtype=torch.long, device=model.device)
    return model(input_ids=input_ids, cache=cache, use_cache=True,
                 output_hidden_states=hidden)
