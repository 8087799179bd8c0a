"""The runtime's forward: one pass of a Llama-family decoder over a ragged batch of requests.

A batch is a list of ``Row``s, each (KV slot, new token ids, optional ancestor mask among the
new ids). Every row's new keys/values are written into its slot first; then each new token
attends to its slot's cached prefix and to the new tokens it may see (all earlier ones, or with
an ancestor mask only its ancestors and itself: tree verification).

The tokens of a batch are laid out flat, ``[N, H]`` with ``N`` the sum of the rows' new
lengths, so the linears, norms and MLPs (most of a pass) cost what the real tokens cost: no
row is padded to another's length (a prompt in a step of decodes would otherwise make every
decode row as long as the prompt). Attention runs per *group*: the short rows (decodes and
verifies) in runs of consecutive KV slots, each padded to its longest new length ``T`` and
context ``C``, with an explicit mask ``[B, 1, T, C]`` for SDPA (additive when batch invariant,
``Attention.mask``; ``split_short`` cuts the runs where padding would cost more than another
call); each long row (a prompt chunk) alone. A group reads its slots' caches as a view, never
a copy. In float32 on an AVX-512 CPU the short rows instead attend as one group through
specdec's kernel (``runtime.attend``: each row reads its slot in place, unpadded, no mask), which
with the panel linear (``runtime.panels``) makes those passes batch invariant too; there the
norms, RoPE with the KV write, and silu * up run fused as well (``runtime.fused``).

Logits come back only for the positions a row asks for (a prefill asks for its last), and the
tapped layers' outputs (the block drafter's features) for the positions it asks for. Terms:
``H`` hidden size, ``h`` / ``kvh`` query / key-value heads, ``d`` head dim, ``V`` vocabulary.

*Batch invariance* (on by default in bfloat16 on CPUs, ``BATCH_INVARIANT``): a token's outputs
are then bitwise the same whatever else its pass holds -- alone as a decode, inside a k-token
verify, next to other requests or a prompt chunk -- so speculative decoding in bfloat16 commits
exactly the tokens plain decoding does. Two things vary with the batch otherwise, both measured
on the bfloat16 kernels of a 2-core Xeon with AMX (docs/BENCHMARKS.md, 2026-12-02): a linear over
more than some number of rows picks another kernel (there, past 32; ``invariant_rows`` finds the
bound for the model's shapes at load, and the linears run in pieces of it), and SDPA's result for
a query depends on how many queries share its head and on the tail of the key count. So rows
(decodes, verifies of any length) attend in one of two ways, each computing a query the same
whatever its batch, over keys padded to whole ``KEY_BLOCK``s (masked out: they add exact zeros):

- *grouped* (the default where its probe passes, ``attention_invariant``): each key-value
  head's queries -- the ``g`` heads of every token of a row that read it (GQA) -- as the queries
  of one head, ``[B, kvh, T * g, d]``, through SDPA. A decode is then ``g`` queries, a verify
  ``T * g``: on the AMX Xeon SDPA gave each the same result for SmolLM2's ``g = 3`` (and for
  ``g`` = 2 and 4), not for ``g = 1``, where a decode is a single query.
- *per query*: one query per head -- a row's tokens become heads of their own, ``[B, kvh * T *
  g, 1, d]`` against its ``[B, kvh, C, d]`` keys, which GQA maps back. Invariant wherever it was
  tried, but each query costs SDPA a kernel call of its own: a pass over 8 requests x 4 tokens
  at a 512-token context took 74.6 ms against grouped's 55.8 (8 x 1: 48.7 and 48.1;
  docs/benchmarks/attention/).

A long prompt chunk (``Row.chunk``) only needs computing the same way every time it comes: its
attention stays SDPA's own and its linears take it in one call, and the scheduler cuts prompts
at fixed points (``actors.scheduler``), so a chunk is the same in every run.

It is not a model zoo: ``weights.py`` says which configs it runs; the rest stay on transformers.
Arithmetic follows transformers' eager Llama (RMSNorm in float32, RoPE tables in float32), so
in float64 it equals the reference to ~1e-12.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import NamedTuple

import torch
import torch.nn.functional as F

from specdec.runtime import attend, fused
from specdec.runtime.pool import KVPool
from specdec.runtime.weights import Layer, Proj, Weights


@dataclass(frozen=True)
class Row:
    slot: int
    ids: Sequence[int]  # [n] new token ids, appended after the slot's cached prefix
    logits_at: Sequence[int]  # indices into ids whose next-token logits to return
    taps_at: Sequence[int] = ()  # indices into ids whose tapped-layer outputs to return
    # [n, n] bool: ancestors[i, j] = new token i sees new token j (j == i and j's ancestors);
    # None = causal. Ancestors come first (lower triangular); a node sits at depth = row sum - 1.
    ancestors: torch.Tensor | None = None
    # a prompt chunk, cut by the caller at the same points in every run: batch invariance may
    # compute it as one piece (SDPA's own attention, one linear call) when it is long
    chunk: bool = False

    def __post_init__(self):
        if not self.ids:
            raise ValueError("a row needs at least one new token")
        n = len(self.ids)
        bad = [i for i in (*self.logits_at, *self.taps_at) if not 0 <= i < n]
        if bad:
            raise ValueError(f"positions {bad} are outside the row's {n} new tokens")
        a = self.ancestors
        if a is not None:
            if a.shape != (n, n) or a.dtype != torch.bool:
                raise ValueError(f"the ancestor mask must be a [{n}, {n}] bool tensor")
            if not bool(a.diagonal().all()) or bool(a.triu(1).any()):
                raise ValueError("the ancestor mask must see itself and only earlier tokens")


@dataclass(frozen=True)
class RowOutput:
    logits: torch.Tensor  # [len(logits_at), V]
    taps: torch.Tensor | None  # [len(taps_at), n_taps * H]; None when none asked for


def rms_norm(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    """Transformers' RMSNorm: normalise in float32, cast back, then scale."""
    h = x.float()
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    return w * h.to(x.dtype)


def rope(x: torch.Tensor, cos: torch.Tensor, sin_signed: torch.Tensor) -> torch.Tensor:
    """Rotary embedding of x [N, heads, d]: transformers' ``x * cos + rotate_half(x) * sin``,
    bitwise, with ``rotate_half(x) * sin`` as x's halves swapped times ``sin_signed`` (sin, its
    first half negated: -a * b is a * -b exactly), two fewer passes over x."""
    return x * cos + x.roll(x.shape[-1] // 2, -1) * sin_signed


SHORT = 32  # rows of at most this many new tokens (decodes, verifies) attend as one group
KEY_BLOCK = 64  # batch-invariant attention reads keys in whole blocks of this many
# dtypes whose passes are made batch invariant by default (on CPUs), by pieces and key blocks;
# float32 is so on specdec's kernels instead (the panel linear and the attention kernel), where
# they run, and otherwise not: its 1-row and multi-row kernels then differ by ~1e-7, which
# flipped no token of the 80-prompt engine benchmark (docs/BENCHMARKS.md)
BATCH_INVARIANT = {torch.bfloat16: True}
INVARIANT_ROWS = 32  # the most rows a batch-invariant linear is tried on at once


def invariant_rows(weights: Weights, most: int = INVARIANT_ROWS, outputs: int = 2 ** 18,
                   seeds: int = 2) -> int:
    """The most rows a linear of this model may run over at once with every row's output
    bitwise what it is alone, on this machine's kernels, tried at each projection's shape as the
    forward runs it (``Proj``: on its packed copy where it has one).

    A multi-row kernel may round like the 1-row one on most inputs and not on all, so each row
    count m is tried on random rows, cut into consecutive pieces of m: the first m that differs
    anywhere bounds the count. Two cases measured: on an AMD EPYC with avx512_bf16, the MLP's
    down projection in 3-5 row pieces matched on the first rows of a random batch and differed
    on others; on the AMX Xeon, a 64 x 64 bfloat16 linear (a test model's) rounded 7 of 262144
    outputs otherwise in 8-row pieces than alone (ties, by their rate), SmolLM2-135M's shapes 0
    of 12.6 million. So each projection gets rows enough for ``outputs`` outputs (at least 96)
    per seed: a difference that rare is then found."""
    projections = [weights.lm_head, *(getattr(weights.layers[0], n) for n in
                                      ("qkv", "o", "gate_up", "down"))]
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


class Attention(NamedTuple):
    """A batch-invariant way to attend (module docstring)."""

    lay_out: Callable  # (mask [B, 1, T, C], kv_heads, g) -> the mask as ``attend`` reads it
    attend: Callable  # (queries [B, T, h, d], keys, values, laid-out mask, scale) -> [B, T, h, d]

    def mask(self, mask: torch.Tensor, kv_heads: int, per_kv: int,
             dtype: torch.dtype) -> torch.Tensor:
        """A group's bool mask [B, 1, T, C] laid out for ``attend`` as the additive mask SDPA
        makes of a bool one (0 where seen, -inf elsewhere, in the queries' dtype): made once a
        step, not by SDPA in every layer (bitwise the same output; 10-17% off a grouped SDPA call
        of 8 rows x 4 tokens on the AMX Xeon, 2026-12-03). Made additive before it is laid out:
        the layouts only repeat its rows, so the conversion runs over [B, 1, T, C] alone."""
        additive = torch.zeros(mask.shape, dtype=dtype, device=mask.device)
        return self.lay_out(additive.masked_fill_(~mask, float("-inf")), kv_heads, per_kv)


ATTENTIONS = {"grouped": Attention(grouped_mask, attend_grouped),
              "per_query": Attention(per_query_mask, attend_per_query)}
# how the short rows of a pass that is not batch invariant by ``BATCH_INVARIANT`` attend:
# specdec's float32 kernel (``runtime.attend``: batch invariant itself), or SDPA by padded groups
PLAIN_ATTENTIONS = ("kernel", "sdpa")
# auto: batch invariant, grouped where its probe passes, else per query; float32 on a CPU, the
# kernel where it builds, else SDPA
ATTENTION_NAMES = ("auto", *ATTENTIONS, *PLAIN_ATTENTIONS)


def attention_invariant(kind: str, heads: int, kv_heads: int, head_dim: int, dtype: torch.dtype,
                        trials: int = 12, seed: int = 0) -> bool:
    """Whether attention ``kind`` gives every query bitwise its result alone on this machine's
    kernels, at this model's head shapes: random batches of up to 8 rows of up to 17 tokens (a
    verify of 16 drafted), then one row of 40 (past ``SHORT``), at contexts of up to 768 keys and
    key counts padded past them (whole ``KEY_BLOCK``s), each token against itself decoded alone
    (its own context, padded the same way)."""
    attention = ATTENTIONS[kind]
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

    with torch.inference_mode():
        for _ in range(trials):
            B = draw(8)
            lengths = torch.randint(0, 768, (B,), generator=gen).tolist()
            if not same(lengths, [draw(17) for _ in range(B)]):
                return False
        return same([draw(700)], [40])


def padded_keys(C: int, key_block: int | None, max_len: int | None) -> int:
    """The keys a group of context ``C`` reads: C rounded up to whole ``key_block``s (at most
    ``max_len``); C itself without a key block."""
    if not key_block:
        return C
    C = -(-C // key_block) * key_block
    return C if max_len is None else min(C, max_len)


def positions_and_mask(rows: Sequence[Row], lengths: Sequence[int], device,
                       key_block: int | None = None, max_len: int | None = None):
    """pos: [B, T] absolute positions (depth in a tree); mask: [B, 1, T, C] keys each query sees,
    T and C the group's longest new length and context (padded queries see key 0 only); with a
    ``key_block``, C is rounded up to whole blocks (at most ``max_len``)."""
    T = max(len(r.ids) for r in rows)
    C = padded_keys(max(c + len(r.ids) for r, c in zip(rows, lengths, strict=True)), key_block,
                    max_len)
    pos = torch.zeros(len(rows), T, dtype=torch.long)
    mask = torch.zeros(len(rows), T, C, dtype=torch.bool)
    mask[:, :, 0] = True  # so no softmax row is empty
    for b, (row, c) in enumerate(zip(rows, lengths, strict=True)):
        n = len(row.ids)
        seen = row.ancestors if row.ancestors is not None else torch.ones(n, n, dtype=torch.bool).tril()
        pos[b, :n] = c + seen.sum(-1) - 1
        mask[b, :n, :c] = True
        mask[b, :n, c:c + n] = seen
    return pos.to(device), mask.unsqueeze(1).to(device)


@dataclass
class Group:
    """Rows of a batch that attend together: a contiguous block of the flat token axis, padded
    to ``[B, T]`` queries against ``[B, C]`` keys for SDPA (T, C: the longest in the group)."""

    rows: list[int]  # indices into the batch, in slot order
    start: int  # first flat token of the block
    size: int  # its tokens
    T: int
    C: int
    # [B, 1, T, C]; None: one query that sees every cached key, or ``causal``
    mask: torch.Tensor | None
    span: tuple[int, int]  # its slots, lo..hi-1 (consecutive): its caches are read as a view
    where: tuple[torch.Tensor, torch.Tensor] | None  # (b, t) of each token; None: no padding
    whole: bool = False  # a long prompt chunk: batch invariance computes it as one piece
    # batch invariant, not whole: ``mask`` laid out for the forward's attention, additive
    # (``Attention.mask``)
    head_mask: torch.Tensor | None = None
    # one row with nothing cached and no ancestor mask, its keys unpadded: SDPA's own causal
    # attention (a prompt's first chunk; it skips the blocks the mask would zero)
    causal: bool = False
    # every short row of the pass on the attention kernel (``runtime.attend``): its rows table
    # [R, 4] and seen [n, S] (empty: causal); T, C, mask, span and where are then unused
    table: tuple[torch.Tensor, torch.Tensor] | None = None


# SDPA's time for one group, in microseconds, as 1, B, B*T, B*C and B*T*C weigh in it (B rows,
# T queries and C keys each, padded): a least-squares fit of the grouped attention over B 1-8,
# T 1-16 and C 128-512 on the AMX Xeon (2026-12-02, SmolLM2-135M's heads; median error 4%).
# Only how the short rows are split into groups follows it, never what a token computes.
ATTENTION_COST = (23.7, 0.52, 0.37, 0.025, 0.0059)


def attention_cost(B: int, T: int, C: int) -> float:
    one, per_row, per_query, per_key, per_score = ATTENTION_COST
    return one + B * (per_row + per_query * T + per_key * C + per_score * T * C)


def split_short(rows: Sequence[Row], lengths: Sequence[int], key_block: int | None,
                max_len: int | None) -> list[list[int]]:
    """The short rows (in slot order) cut into runs that attend as groups, each a run of
    consecutive slots (it reads its caches as a view, never a copy): padded to its own longest
    row and context, so one long draft or long context does not pad every row of the step, at
    the price of another SDPA call per group -- the cut of least ``attention_cost``."""
    n = len(rows)
    best, cut = [0.0] + [float("inf")] * n, [0] * (n + 1)
    for j in range(1, n + 1):
        T = C = 0
        for i in range(j - 1, -1, -1):  # the run i..j-1, grown leftwards
            if i < j - 1 and rows[i].slot + 1 != rows[i + 1].slot:
                break
            T = max(T, len(rows[i].ids))
            C = max(C, lengths[i] + len(rows[i].ids))
            cost = best[i] + attention_cost(j - i, T, padded_keys(C, key_block, max_len))
            if cost < best[j]:
                best[j], cut[j] = cost, i
    runs, j = [], n
    while j:
        runs.append(list(range(cut[j], j)))
        j = cut[j]
    return runs[::-1]


def kernel_group(rows: Sequence[Row], lengths: Sequence[int], members: list[int],
                 device) -> tuple[Group, torch.Tensor]:
    """The short rows ``members`` as one group for the attention kernel (``runtime.attend``),
    laid out flat from token 0, and their tokens' RoPE positions."""
    table, seen, positions, start = [], [], [], 0
    tree = any(rows[b].ancestors is not None for b in members)
    for b in members:
        r, c, n = rows[b], lengths[b], len(rows[b].ids)
        table.append((start, n, r.slot, c))
        if r.ancestors is None:  # causal: token t at c + t
            positions += range(c, c + n)
            sees = torch.ones(n, n, dtype=torch.bool).tril() if tree else None
        else:  # a node at its depth
            sees = r.ancestors
            positions += (c + sees.sum(-1) - 1).tolist()
        if tree:
            seen.append(F.pad(sees, (0, SHORT - n)))
        start += n
    seen = torch.cat(seen).to(torch.uint8) if tree else torch.empty(0, dtype=torch.uint8)
    group = Group(members, 0, start, max(len(rows[b].ids) for b in members), 0, None, (0, 0), None,
                  table=(torch.tensor(table, dtype=torch.long), seen))
    return group, torch.tensor(positions, dtype=torch.long, device=device)


def plan_groups(rows: Sequence[Row], lengths: Sequence[int], device,
                key_block: int | None = None, max_len: int | None = None, kernel: bool = False):
    """Lay a batch out flat: the short rows (decodes and verifies) first, in slot order, in
    groups of consecutive slots (``split_short``), each padded to its longest, or with the
    attention ``kernel`` as one group, unpadded; then each long row (a prompt chunk) alone, so
    no prompt pads a decode. Returns the groups, each row's first flat token, and the flat
    tokens' RoPE positions [N]. With a ``key_block`` (batch invariance) every group but a long
    prompt chunk's reads whole key blocks, through a mask."""
    short = sorted((b for b, r in enumerate(rows) if len(r.ids) <= SHORT), key=lambda b: rows[b].slot)
    groups, offsets, positions, start = [], [0] * len(rows), [], 0
    if kernel and short:
        group, pos = kernel_group(rows, lengths, short, device)
        groups.append(group)
        positions.append(pos)
        for b, (first, *_) in zip(short, group.table[0].tolist(), strict=True):
            offsets[b] = first
        start = group.size
        runs = []
    else:
        runs = split_short([rows[b] for b in short], [lengths[b] for b in short], key_block, max_len)
    parts = [([short[i] for i in run], False) for run in runs] + [
        ([b], r.chunk) for b, r in enumerate(rows) if len(r.ids) > SHORT]
    for members, whole in parts:
        block = None if whole else key_block
        pos, mask = positions_and_mask([rows[b] for b in members], [lengths[b] for b in members],
                                       device, block, max_len)
        ns = [len(rows[b].ids) for b in members]
        B, T = pos.shape
        where = None
        if any(n != T for n in ns):
            where = tuple(torch.tensor(ix, device=device) for ix in
                          zip(*[(i, t) for i, n in enumerate(ns) for t in range(n)], strict=True))
        lo = rows[members[0]].slot
        alone = B == 1 and not block  # one row, its keys unpadded
        causal = alone and T > 1 and lengths[members[0]] == 0 and rows[members[0]].ancestors is None
        groups.append(Group(members, start, sum(ns), T, mask.shape[-1],
                            None if alone and (T == 1 or causal) else mask,
                            (lo, lo + B), where, whole, causal=causal))
        for b, n in zip(members, ns, strict=True):
            offsets[b] = start
            start += n
        positions.append(pos.reshape(-1) if where is None else pos[where])
    return groups, offsets, torch.cat(positions)


class Forward:
    """The decoder over a ``Weights`` and a ``KVPool``; ``__call__`` runs one ragged batch.
    ``invariant``: batch invariance (see the module docstring); None: ``BATCH_INVARIANT``.
    ``attention``: how a batch-invariant pass attends (a key of ``ATTENTIONS``); auto: grouped
    where its probe passes on this machine at the model's head shapes, else per query."""

    def __init__(self, weights: Weights, pool: KVPool, tap_layers: Sequence[int] = (),
                 invariant: bool | None = None, attention: str = "auto"):
        self.w, self.pool, self.tap_layers = weights, pool, tuple(tap_layers)
        s = weights.shape
        self.q_size, self.kv_size = s.heads * s.head_dim, s.kv_heads * s.head_dim
        dtype = weights.embed.dtype
        invariant, attention = self.plan_attention(weights, invariant, attention)
        # batch invariance: linears over at most this many rows at once (None: off)
        self.rows = invariant_rows(weights) if invariant else None
        # grouped / per_query (batch invariant), kernel, or None: SDPA by padded groups
        self.attention_kind = attention
        cache = pool.dtype
        if cache != dtype and not (cache == torch.float16 and float16_caches(dtype, attention)):
            raise ValueError(f"a {cache} KV pool needs {dtype} passes that attend on the kernel "
                             f"(float16 caches only; this one attends {attention or 'by SDPA'})")
        # float32 on an AVX-512 CPU: the norms, RoPE with the KV write, and silu * up fused
        # (``runtime.fused``; RoPE where the head dim fits it)
        self.fused = not invariant and fused.usable(dtype, weights.embed.device)
        self.fused_rope = self.fused and fused.rope_fits(s.head_dim)

    @classmethod
    def plan_attention(cls, weights: Weights, invariant: bool | None = None,
                       attention: str = "auto") -> tuple[bool, str | None]:
        """(whether the passes are batch invariant, how they attend: grouped / per_query, kernel,
        or None for SDPA by padded groups), as ``__init__`` takes them."""
        s, dtype = weights.shape, weights.embed.dtype
        if invariant is None:  # measured on CPUs only
            invariant = weights.embed.device.type == "cpu" and BATCH_INVARIANT.get(dtype, False)
        if attention not in ATTENTION_NAMES:
            raise ValueError(f"attention must be one of {list(ATTENTION_NAMES)}, not {attention!r}")
        if invariant and attention in PLAIN_ATTENTIONS:
            raise ValueError(f"attention {attention!r} is for passes that are not batch invariant; "
                             f"{dtype} ones attend {list(ATTENTIONS)} (or auto)")
        if invariant and attention == "auto":
            grouped = attention_invariant("grouped", s.heads, s.kv_heads, s.head_dim, dtype)
            attention = "grouped" if grouped else "per_query"
        if not invariant:
            attention = cls._plain_attention(attention, dtype, weights.embed.device, s.head_dim)
        return invariant, attention if invariant or attention == "kernel" else None

    @staticmethod
    def _plain_attention(attention: str, dtype, device, head_dim: int) -> str | None:
        """How a pass that is not batch invariant by ``BATCH_INVARIANT`` attends: ``kernel``
        where asked for or, with auto, where it runs (float32 on a CPU), else SDPA."""
        if attention == "kernel":
            reason = ("it runs float32 on a CPU" if dtype != torch.float32 or device.type != "cpu"
                      else attend.unavailable(head_dim))
            if reason:
                raise ValueError(f"attention 'kernel' cannot run here: {reason}")
            return "kernel"
        return "kernel" if attention == "auto" and attend.usable(dtype, device, head_dim) else None

    @property
    def invariant_attention(self) -> Attention | None:
        """The batch-invariant attention this forward runs (None: not batch invariant)."""
        return ATTENTIONS.get(self.attention_kind)

    @property
    def key_block(self) -> int | None:
        """Batch invariant: every group but a long prompt chunk's reads keys in whole blocks of
        this many (else None)."""
        return None if self.rows is None else KEY_BLOCK

    def linear(self, x: torch.Tensor, p: Proj, parts: list[int] | None = None) -> torch.Tensor:
        """x: [N, in] -> [N, out]. Batch invariant: one call of the projection per part of the
        flat axis (``parts``, see ``parts``; None: ``self.rows`` rows at a time). Else a single
        row uses the [in, out] copy where the layout has one (see ``weights``), and everything
        else one call of the projection (float32 with panels: every pass, ``runtime.panels``)."""
        if self.rows is not None:
            pieces = x.split(parts or self.rows)
            if len(pieces) == 1:
                return p(x)
            return torch.cat([p(piece) for piece in pieces])
        if x.numel() == x.shape[-1] and p.wt is not None:
            y = x @ p.wt
            return y if p.bias is None else y + p.bias
        return p(x)

    def parts(self, groups: list[Group]) -> list[int] | None:
        """Batch invariant: how the linears cut the flat tokens -- each run of groups that are
        not long prompt chunks in pieces of at most ``self.rows`` (each row's outputs are then
        what they are alone, whatever its piece holds), a long prompt chunk whole (it always
        comes whole). None when not batch invariant."""
        if self.rows is None:
            return None
        out, run = [], 0  # run: rows of the groups since the last prompt chunk
        for g in groups:
            if g.whole:  # a long prompt chunk
                out += self._pieces(run) + [g.size]
                run = 0
            else:
                run += g.size
        return out + self._pieces(run)

    def _pieces(self, rows: int) -> list[int]:
        """``rows`` consecutive rows cut into pieces of at most ``self.rows``."""
        whole, rest = divmod(rows, self.rows)
        return [self.rows] * whole + ([rest] if rest else [])

    @torch.inference_mode()
    def __call__(self, rows: Sequence[Row]) -> list[RowOutput]:
        pool, s = self.pool, self.w.shape
        lengths = [pool.lengths[r.slot] for r in rows]
        if len({r.slot for r in rows}) != len(rows):
            raise ValueError("two rows of one batch share a KV slot")
        for r, c in zip(rows, lengths, strict=True):
            if c + len(r.ids) > pool.max_len:
                raise ValueError(f"sequence of {c + len(r.ids)} tokens exceeds the KV slot's "
                                 f"{pool.max_len} positions")
        device = self.w.embed.device
        groups, offsets, pos = plan_groups(rows, lengths, device, self.key_block, pool.max_len,
                                           kernel=self.attention_kind == "kernel")
        order = [b for g in groups for b in g.rows]
        ids = torch.tensor([t for b in order for t in rows[b].ids], dtype=torch.long, device=device)
        # where each flat token's key / value goes: its slot, at its index after the cache
        write_slots = torch.tensor([rows[b].slot for b in order for _ in rows[b].ids], device=device)
        write_at = torch.tensor([lengths[b] + t for b in order for t in range(len(rows[b].ids))],
                                device=device)
        cos, sin_signed = (t[pos].unsqueeze(1) for t in (self.w.cos, self.w.sin_signed))  # [N, 1, d]
        for g in groups:
            invariant = self.rows is not None and not g.whole
            if g.table is None and (len(g.rows) > 1 or invariant):  # a group padded along
                for b in g.rows:  # the keys reads past a slot's end (the kernel never does)
                    pool.ensure_clean(rows[b].slot, g.C)
            if invariant:
                g.head_mask = self.invariant_attention.mask(
                    g.mask, s.kv_heads, s.heads // s.kv_heads, self.w.embed.dtype)
        parts = self.parts(groups)
        x = self.w.embed[ids]  # [N, H]
        taps = {}  # layer -> its output [N, H], for the tapped layers only
        for i, layer in enumerate(self.w.layers):
            x = x + self.attention(i, layer, self.norm(x, layer.attn_norm), groups,
                                   (cos, sin_signed), (write_slots, write_at), parts)
            x = x + self.mlp(layer, self.norm(x, layer.mlp_norm), parts)
            if i in self.tap_layers:  # the last layer's output is read after the final norm, as
                taps[i] = x if i < s.layers - 1 else self.norm(x, self.w.norm)  # in HF
        for r in rows:
            pool.advance(r.slot, len(r.ids))
        return self.outputs(rows, offsets, x, taps)

    def attention(self, i: int, layer: Layer, x, groups: list[Group],
                  rotary: tuple[torch.Tensor, torch.Tensor],
                  write: tuple[torch.Tensor, torch.Tensor],
                  parts: list[int] | None = None) -> torch.Tensor:
        """x: [N, H] normed flat tokens; rotary: each token's (cos, sin_signed) rows for
        ``rope``; write: (slot, position) of each token's key / value; parts: the linears' cuts
        (``parts``). Every new key / value goes into the caches first;
        then each group attends on its own."""
        s = self.w.shape
        N = x.shape[0]
        qkv = self.linear(x, layer.qkv, parts)  # [N, (h + 2 kvh) d]
        if self.fused_rope and layer.q_norm is None:  # RoPE and the KV write in one call
            q = fused.rope_write(qkv, *rotary, self.pool.k[i], self.pool.v[i], *write, s.heads)
        else:
            qk, v = qkv.split([self.q_size + self.kv_size, self.kv_size], dim=-1)
            qk = qk.view(N, s.heads + s.kv_heads, s.head_dim)
            if layer.q_norm is not None:  # Qwen3: RMSNorm over each head before RoPE
                qk = torch.cat([rms_norm(qk[:, :s.heads], layer.q_norm, s.eps),
                                rms_norm(qk[:, s.heads:], layer.k_norm, s.eps)], dim=1)
            q, k = rope(qk, *rotary).split([s.heads, s.kv_heads], dim=1)  # q's, k's heads at once
            self.pool.write(i, *write, k, v.view(N, s.kv_heads, s.head_dim))
        outs = [self._attend(i, g, q[g.start:g.start + g.size]) for g in groups]
        out = outs[0] if len(outs) == 1 else torch.cat(outs)
        return self.linear(out, layer.o, parts)

    def _attend(self, i: int, g: Group, q: torch.Tensor) -> torch.Tensor:
        """One group's queries [n, h, d] against its slots' caches; returns [n, h * d]."""
        s, pool = self.w.shape, self.pool
        if g.table is not None:
            return attend.attend(q, pool.k[i], pool.v[i], *g.table, s.head_dim ** -0.5)
        B, T = len(g.rows), g.T
        if g.where is None:
            queries = q.view(B, T, s.heads, s.head_dim)
        else:
            queries = q.new_zeros(B, T, s.heads, s.head_dim)
            queries[g.where] = q
        lo, hi = g.span  # a view of the slots, no copy: [B, kvh, C, d]
        keys, values = pool.k[i][lo:hi, :, :g.C], pool.v[i][lo:hi, :, :g.C]
        if keys.dtype != q.dtype:  # float16 caches of float32 passes (a long prompt chunk)
            keys, values = keys.to(q.dtype), values.to(q.dtype)
        scale = s.head_dim ** -0.5
        if g.head_mask is not None:  # batch invariant
            out = self.invariant_attention.attend(queries, keys, values, g.head_mask, scale)
        else:
            out = F.scaled_dot_product_attention(queries.transpose(1, 2), keys, values,
                                                 attn_mask=g.mask, is_causal=g.causal, scale=scale,
                                                 enable_gqa=s.heads != s.kv_heads).transpose(1, 2)
        if g.where is not None:  # out: [B, T, h, d]
            out = out[g.where]  # [n, h, d]: the real tokens only
        return out.reshape(-1, self.q_size)

    def norm(self, x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        """The RMSNorm of x [N, H] (fused where ``self.fused``)."""
        if self.fused:
            return fused.rms_norm(x, w, self.w.shape.eps)
        return rms_norm(x, w, self.w.shape.eps)

    def mlp(self, layer: Layer, x: torch.Tensor, parts: list[int] | None = None) -> torch.Tensor:
        gate_up = self.linear(x, layer.gate_up, parts)
        if self.fused:
            return self.linear(fused.silu_mul(gate_up), layer.down, parts)
        gate, up = gate_up.chunk(2, dim=-1)
        return self.linear(F.silu(gate) * up, layer.down, parts)

    def outputs(self, rows, offsets: list[int], x: torch.Tensor, taps: dict) -> list[RowOutput]:
        """Final norm + lm_head only at the asked-for positions; taps = outputs of layer l."""
        at = [offsets[b] + i for b, r in enumerate(rows) for i in r.logits_at]
        index = torch.tensor(at, dtype=torch.long, device=x.device)
        logits = self.linear(self.norm(x[index], self.w.norm), self.w.lm_head)
        out, start = [], 0
        for b, r in enumerate(rows):
            row_logits = logits[start:start + len(r.logits_at)]
            start += len(r.logits_at)
            tapped = None
            if r.taps_at and self.tap_layers:
                where = torch.tensor([offsets[b] + i for i in r.taps_at], dtype=torch.long,
                                     device=x.device)
                tapped = torch.cat([taps[layer][where] for layer in self.tap_layers], dim=-1)
            out.append(RowOutput(row_logits, tapped))
        return out


# How the KV pool stores keys and values (``cache_dtype``). float16 halves the bytes a pass
# reads from its slots, which a batch of decodes is bound by on a CPU: on the 2-core AMX Xeon
# with int8 rows (2026-12-06, 160 cached tokens, docs/benchmarks/kv-float16) a pass of 8 decodes
# took 0.89x the time on float16 caches, 16 decodes 0.86x, one 0.95x; verifies of 4 tokens and a
# prefill about the same (0.93-1.05x). llama.cpp's CPU backend keeps float16 caches by default too.
KV_CACHE_DTYPES = ("auto", "model", "float16")


def float16_caches(dtype: torch.dtype, attention_kind: str | None) -> bool:
    """Whether passes of ``dtype`` that attend ``attention_kind`` (``Forward.plan_attention``'s)
    read float16 KV caches exactly: float32 ones on specdec's kernel."""
    return dtype == torch.float32 and attention_kind == "kernel"


def cache_dtype(weights: Weights, kv_cache_dtype: str = "auto", attention: str = "auto",
                invariant: bool | None = None) -> torch.dtype:
    """The dtype of the KV pool for a ``Forward(weights, ..., invariant, attention)``: model:
    its passes' own; float16: float16 for float32 passes that attend on specdec's kernel (it
    reads them exactly as float32; the keys and values are rounded once, when written), an
    error elsewhere; auto: float16 where it can be, else the model's."""
    if kv_cache_dtype not in KV_CACHE_DTYPES:
        raise ValueError(f"kv_cache_dtype must be one of {list(KV_CACHE_DTYPES)}, "
                         f"not {kv_cache_dtype!r}")
    dtype = weights.embed.dtype
    if kv_cache_dtype == "model" or (kv_cache_dtype == "auto" and dtype != torch.float32):
        return dtype  # (other dtypes attend without the kernel: no attention plan, no probe)
    _, kind = Forward.plan_attention(weights, invariant, attention)
    if float16_caches(dtype, kind):
        return torch.float16
    if kv_cache_dtype == "float16":
        raise ValueError(f"kv_cache_dtype float16 needs float32 passes that attend on specdec's "
                         f"kernel; these are {dtype} and attend "
                         f"{kind or 'by SDPA'} (kv_cache_dtype: auto or model)")
    return dtype
