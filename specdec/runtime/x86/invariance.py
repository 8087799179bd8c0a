"""Batch invariance by probes on this machine's kernels (the x86 backend's bfloat16 passes).

Two things vary with the batch on CPU kernels: a linear over more than some number of rows picks
another kernel (``invariant_rows`` finds the bound for the model's shapes at load, and the
linears then run in pieces of it), and SDPA's result for a query depends on how many queries
share its head and on the tail of the key count. So rows attend in one of two ways, each
computing a query the same whatever its batch, over keys padded to whole ``KEY_BLOCK``s (masked
out: they add exact zeros):

- *grouped* (where its probe passes, ``attention_invariant``): each key-value head's queries --
  the ``g`` heads of every token of a row that read it (GQA) -- as the queries of one head,
  ``[B, kvh, T * g, d]``, through SDPA. A decode is then ``g`` queries, a verify ``T * g``.
- *per query*: one query per head -- a row's tokens become heads of their own, ``[B, kvh * T *
  g, 1, d]`` against its ``[B, kvh, C, d]`` keys, which GQA maps back. Invariant wherever it was
  tried, at the price of a kernel call per query (docs/RESULTS.md).

Both run on one thread (``one_thread``): SDPA's CPU kernel shares a call's work among the
threads it has, and with two a query's result moved with the rest of its call where one thread
gave it bitwise (the probe, 30 trials at SmolLM2's heads). The probes decide at load; the plan
says which ran (``specdec.runtime.plan``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import NamedTuple

import torch
import torch.nn.functional as F

KEY_BLOCK = 64  # batch-invariant attention reads keys in whole blocks of this many


@contextmanager
def one_thread() -> Iterator[None]:
    """torch's intra-op threads at 1 for the block, then back as they were."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)
INVARIANT_ROWS = 32  # the most rows a batch-invariant linear is tried on at once


def probed(weights) -> list:
    """The linears ``invariant_rows`` tries: the head and the first layer's projections (every
    layer's have the same shapes and kernels)."""
    return [weights.lm_head, *(getattr(weights.layers[0], n) for n in
                               ("qkv", "o", "gate_up", "down"))]


def invariant_rows(weights, most: int = INVARIANT_ROWS, outputs: int = 2 ** 18,
                   seeds: int = 2) -> int:
    """The most rows a linear of this model may run over at once with every row's output
    bitwise what it is alone, on this machine's kernels, tried at each projection's shape as the
    forward runs it (each ``Linear`` as the backend built it).

    A multi-row kernel may round like the 1-row one on most inputs and not on all (ties, by
    their rate), so each row count m is tried on random rows, cut into consecutive pieces of m:
    the first m that differs anywhere bounds the count. Each projection gets rows enough for
    ``outputs`` outputs (at least 96) per seed, so a rare difference is found."""
    projections = probed(weights)
    cases = []
    with torch.inference_mode():
        for seed in range(seeds):
            gen = torch.Generator().manual_seed(seed)
            for p in projections:
                n = max(96, -(-outputs // p.w.shape[0]))
                x = torch.randn(n, p.w.shape[1], generator=gen).to(p.w)
                cases.append((p, x, torch.cat([p(x[i:i + 1]) for i in range(n)])))
        for m in range(2, most + 1):
            for p, x, alone in cases:
                pieces = torch.cat([p(x[j:j + m]) for j in range(0, len(x), m)])
                if not torch.equal(pieces, alone):
                    return m - 1
    return most


def grouped_mask(mask: torch.Tensor, kv_heads: int, per_kv: int) -> torch.Tensor:
    """A group's mask [B, 1, T, C] for ``attend_grouped``: [B, 1, T * g, C]."""
    B, _, T, C = mask.shape
    return mask.view(B, 1, T, 1, C).expand(B, 1, T, per_kv, C).reshape(B, 1, T * per_kv, C)


def attend_grouped(queries: torch.Tensor, keys: torch.Tensor, values: torch.Tensor,
                   mask: torch.Tensor, scale: float) -> torch.Tensor:
    """queries [B, T, h, d] against keys / values [B, kvh, C, d], each key-value head's T * g
    queries as one head (head kv * g + j reads kv head kv); mask from ``grouped_mask``.
    Returns [B, T, h, d]."""
    B, T, h, d = queries.shape
    kvh = keys.shape[1]
    g = h // kvh
    grouped = queries.view(B, T, kvh, g, d).permute(0, 2, 1, 3, 4).reshape(B, kvh, T * g, d)
    out = F.scaled_dot_product_attention(grouped, keys, values, attn_mask=mask, scale=scale)
    return out.view(B, kvh, T, g, d).permute(0, 2, 1, 3, 4).reshape(B, T, h, d)


def per_query_mask(mask: torch.Tensor, kv_heads: int, per_kv: int) -> torch.Tensor:
    """A group's mask [B, 1, T, C] for ``attend_per_query``: [B, kvh * T * g, 1, C] (query head
    kv * T * g + t * g + j is token t's head kv * g + j)."""
    B, _, T, C = mask.shape
    return (mask.view(B, 1, T, 1, C).expand(B, kv_heads, T, per_kv, C).reshape(B, -1, 1, C))


def attend_per_query(queries: torch.Tensor, keys: torch.Tensor, values: torch.Tensor,
                     mask: torch.Tensor, scale: float) -> torch.Tensor:
    """queries [B, T, h, d] against keys / values [B, kvh, C, d], each token's heads as heads of
    their own with one query each; mask from ``per_query_mask``. Returns [B, T, h, d]."""
    B, T, h, d = queries.shape
    kvh = keys.shape[1]
    g = h // kvh
    packed = (queries.view(B, T, kvh, g, d).permute(0, 2, 1, 3, 4)
              .reshape(B, -1, 1, d))  # [B, kvh * T * g, 1, d]
    out = F.scaled_dot_product_attention(packed, keys, values, attn_mask=mask, scale=scale,
                                         enable_gqa=T * g > 1)  # also MHA: T heads per kv head
    return out.view(B, kvh, T, g, d).permute(0, 2, 1, 3, 4).reshape(B, T, h, d)


class Invariant(NamedTuple):
    """A batch-invariant way to attend (module docstring)."""

    lay_out: Callable  # (mask [B, 1, T, C], kv_heads, g) -> the mask as ``attend`` reads it
    attend: Callable  # (queries [B, T, h, d], keys, values, laid-out mask, scale) -> [B, T, h, d]

    def mask(self, mask: torch.Tensor, kv_heads: int, per_kv: int,
             dtype: torch.dtype) -> torch.Tensor:
        """A group's bool mask [B, 1, T, C] laid out for ``attend`` as the additive mask SDPA
        makes of a bool one (0 where seen, -inf elsewhere, in the queries' dtype): made once a
        pass, not by SDPA in every layer (bitwise the same output, cheaper). Made additive
        before it is laid out: the layouts only repeat its rows."""
        additive = torch.zeros(mask.shape, dtype=dtype, device=mask.device)
        return self.lay_out(additive.masked_fill_(~mask, float("-inf")), kv_heads, per_kv)


INVARIANTS = {"grouped": Invariant(grouped_mask, attend_grouped),
              "per_query": Invariant(per_query_mask, attend_per_query)}


def attention_invariant(kind: str, heads: int, kv_heads: int, head_dim: int, dtype: torch.dtype,
                        trials: int = 12, seed: int = 0) -> bool:
    """Whether attention ``kind`` gives every query bitwise its result alone on this machine's
    kernels, at this model's head shapes: random batches of up to 8 rows of up to 17 tokens (a
    verify of 16 drafted), then one row of 40 (past ``SHORT``), at contexts of up to 768 keys and
    key counts padded past them (whole ``KEY_BLOCK``s), each token against itself decoded alone
    (its own context, padded the same way)."""
    attention = INVARIANTS[kind]
    per_kv = heads // kv_heads
    gen = torch.Generator().manual_seed(seed)

    def padded(n):
        return -(-n // KEY_BLOCK) * KEY_BLOCK

    def run(q, k, v, seen):  # seen: [B, T, C] bool
        mask = attention.mask(seen.unsqueeze(1), kv_heads, per_kv, q.dtype)
        return attention.attend(q, k, v, mask, head_dim ** -0.5)

    def draw(n):
        return int(torch.randint(1, n + 1, (1,), generator=gen))

    def same(lengths: list[int], ns: list[int]) -> bool:
        C = padded(max(c + n for c, n in zip(lengths, ns, strict=True)) + draw(4 * KEY_BLOCK))
        B, T = len(ns), max(ns) + draw(2) - 1  # sometimes a padded query too
        q = torch.randn(B, T, heads, head_dim, generator=gen).to(dtype)
        k, v = (torch.randn(B, kv_heads, C, head_dim, generator=gen).to(dtype) for _ in "kv")
        seen = torch.zeros(B, T, C, dtype=torch.bool)
        seen[:, :, 0] = True
        for b, (c, n) in enumerate(zip(lengths, ns, strict=True)):
            for t in range(n):
                seen[b, t, :c + t + 1] = True
        batch = run(q, k, v, seen)
        for b, (c, n) in enumerate(zip(lengths, ns, strict=True)):
            for t in range(n):
                own = padded(c + t + 1)
                alone = run(q[b:b + 1, t:t + 1], k[b:b + 1, :, :own], v[b:b + 1, :, :own],
                            seen[b:b + 1, t:t + 1, :own])
                if not torch.equal(alone[0, 0], batch[b, t]):
                    return False
        return True

    with torch.inference_mode(), one_thread():
        for _ in range(trials):
            B = draw(8)
            lengths = torch.randint(0, 768, (B,), generator=gen).tolist()
            if not same(lengths, [draw(17) for _ in range(B)]):
                return False
        return same([draw(700)], [40])
