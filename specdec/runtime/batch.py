"""Rows and batch planning: how a ragged batch of requests is laid out for one pass.

A batch is a list of ``Row``s, each (KV slot, new token ids, optional ancestor mask among the
new ids). The forward lays their tokens out flat, ``[N, H]`` with ``N`` the sum of the rows'
new lengths, so the linears, norms and MLPs cost what the real tokens cost: no row is padded to
another's length. Attention runs per ``Group``:

- the short rows (decodes and verifies, at most ``SHORT`` new tokens) in runs of consecutive
  KV slots, each padded to its longest new length ``T`` and context ``C`` with an explicit mask
  ``[B, 1, T, C]`` (``split_short`` cuts the runs where padding would cost more than another
  call, by the backend attention's ``cost``); a group reads its slots' caches as a view;
- or, where the backend attends short rows from a table (``table``: every row reads its slot in
  place, unpadded, no mask), all short rows as one group;
- each long row (a prompt chunk) alone.

It is pure planning over token ids and lengths: no weights, no kernels. Terms: ``B`` rows of a
group, ``T`` its padded new tokens, ``C`` its padded keys.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F

SHORT = 32  # rows of at most this many new tokens (decodes, verifies) attend as short rows


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


@dataclass
class Group:
    """Rows of a batch that attend together: a contiguous block of the flat token axis, padded
    to ``[B, T]`` queries against ``[B, C]`` keys (T, C: the longest in the group)."""

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
    # the mask as the backend's attention reads it (``Attention.lay_out``), made once a pass
    head_mask: torch.Tensor | None = None
    # one row with nothing cached and no ancestor mask, its keys unpadded: SDPA's own causal
    # attention (a prompt's first chunk; it skips the blocks the mask would zero)
    causal: bool = False
    # every short row of the pass as one table (``table_group``): rows [R, 4] and seen [n, S]
    # (empty: causal); T, C, mask, span and where are then unused
    table: tuple[torch.Tensor, torch.Tensor] | None = None


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


def padding_cost(B: int, T: int, C: int) -> float:
    """A group's attention cost where the backend has no measured one: a call's fixed cost, in
    scores, plus the scores its padded queries and keys compute."""
    return 4096 + B * T * C


def split_short(rows: Sequence[Row], lengths: Sequence[int], key_block: int | None,
                max_len: int | None, cost: Callable[[int, int, int], float] = padding_cost
                ) -> list[list[int]]:
    """The short rows (in slot order) cut into runs that attend as groups, each a run of
    consecutive slots (it reads its caches as a view, never a copy): padded to its own longest
    row and context, so one long draft or long context does not pad every row of the step, at
    the price of another attention call per group -- the cut of least ``cost(B, T, C)``."""
    n = len(rows)
    best, cut = [0.0] + [float("inf")] * n, [0] * (n + 1)
    for j in range(1, n + 1):
        T = C = 0
        for i in range(j - 1, -1, -1):  # the run i..j-1, grown leftwards
            if i < j - 1 and rows[i].slot + 1 != rows[i + 1].slot:
                break
            T = max(T, len(rows[i].ids))
            C = max(C, lengths[i] + len(rows[i].ids))
            total = best[i] + cost(j - i, T, padded_keys(C, key_block, max_len))
            if total < best[j]:
                best[j], cut[j] = total, i
    runs, j = [], n
    while j:
        runs.append(list(range(cut[j], j)))
        j = cut[j]
    return runs[::-1]


def table_group(rows: Sequence[Row], lengths: Sequence[int], members: list[int],
                device) -> tuple[Group, torch.Tensor]:
    """The short rows ``members`` as one table group (each row read in place, unpadded), laid
    out flat from token 0, and their tokens' RoPE positions."""
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
                key_block: int | None = None, max_len: int | None = None, table: bool = False,
                cost: Callable[[int, int, int], float] = padding_cost):
    """Lay a batch out flat: the short rows first, in slot order, in groups of consecutive
    slots (``split_short``), each padded to its longest, or with ``table`` as one table group;
    then each long row (a prompt chunk) alone, so no prompt pads a decode. Returns the groups,
    each row's first flat token, and the flat tokens' RoPE positions [N]. With a ``key_block``
    (batch invariance) every group but a long prompt chunk's reads whole key blocks."""
    short = sorted((b for b, r in enumerate(rows) if len(r.ids) <= SHORT), key=lambda b: rows[b].slot)
    groups, offsets, positions, start = [], [0] * len(rows), [], 0
    runs = []
    if table and short:
        group, pos = table_group(rows, lengths, short, device)
        groups.append(group)
        positions.append(pos)
        for b, (first, *_) in zip(short, group.table[0].tolist(), strict=True):
            offsets[b] = first
        start = group.size
    elif short:
        runs = split_short([rows[b] for b in short], [lengths[b] for b in short], key_block,
                           max_len, cost)
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
