"""Thin helpers over HF's DynamicCache, so the rest of specdec speaks in absolute lengths."""

from __future__ import annotations

import inspect
from functools import cache as memo

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


@memo
def cache_kwarg(model_class: type) -> str:
    """The forward argument that takes the cache: ``cache`` from transformers 5.2x on,
    ``past_key_values`` before (a model given an unknown name silently runs without a cache)."""
    params = inspect.signature(model_class.forward).parameters
    return "cache" if "cache" in params else "past_key_values"


def cached_forward(model, ids: list[int], cache: DynamicCache, hidden: bool = False, **extra):
    """One forward of ``ids`` appended to ``cache`` (extended in place); ``extra`` goes to the
    model (e.g. ``logits_to_keep``)."""
    input_ids = torch.tensor([ids], dtype=torch.long, device=model.device)
    before = cache.get_seq_length()
    out = model(input_ids=input_ids, use_cache=True, output_hidden_states=hidden,
                **{cache_kwarg(type(model)): cache}, **extra)
    if cache.get_seq_length() != before + len(ids):
        raise RuntimeError(f"{type(model).__name__} did not extend its cache "
                           f"({before} + {len(ids)} -> {cache.get_seq_length()})")
    return out
