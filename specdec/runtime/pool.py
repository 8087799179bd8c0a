"""The KV slot pool: one preallocated cache for every request the target serves at once.

Each request holds one *slot*: a row of ``k[layer]`` / ``v[layer]``, each
``[slots, kv_heads, max_len, head_dim]``, and a length (positions ``0..length-1`` are valid).
Cropping a request is setting its length; a freed slot goes back to the pool and is reused.
A full pool raises ``PoolFull``, which serving turns into an HTTP 503.

It knows nothing about models or attention: the forward (``forward.py``) writes into it and reads
from it. Memory is taken with ``torch.empty``, so the pages a slot never touches cost nothing;
positions a padded batch may read past a slot's end are zeroed once (``ensure_clean``), so
masked-out garbage can never turn into NaN (0 * NaN is NaN inside the attention matmul).
"""

from __future__ import annotations

import torch

CLEAN_AHEAD = 64  # positions zeroed at least, once a slot's padded reads pass its clean mark


class PoolFull(RuntimeError):
    """Every KV slot is taken: the server is at its limit (HTTP 503), not broken."""


class KVPool:
    def __init__(self, layers: int, slots: int, kv_heads: int, max_len: int, head_dim: int,
                 dtype: torch.dtype, device: torch.device | str = "cpu"):
        if slots < 1 or max_len < 1:
            raise ValueError(f"a KV pool needs at least one slot and one position "
                             f"(got {slots} slots of {max_len})")
        shape = (slots, kv_heads, max_len, head_dim)
        self.k = [torch.empty(shape, dtype=dtype, device=device) for _ in range(layers)]
        self.v = [torch.empty(shape, dtype=dtype, device=device) for _ in range(layers)]
        self.slots, self.max_len = slots, max_len
        self.lengths = [0] * slots  # valid positions per slot
        self.clean = [0] * slots  # positions below this hold finite values (written or zeroed)
        self.free = list(range(slots - 1, -1, -1))  # a stack: the lowest slot comes out first

    @property
    def dtype(self) -> torch.dtype:
        """How the caches store keys and values."""
        return self.k[0].dtype

    def acquire(self) -> int:
        if not self.free:
            raise PoolFull(f"all {self.slots} KV cache slots are in use; retry when a request "
                           f"finishes (or raise the pool size)")
        slot = self.free.pop()
        self.lengths[slot] = 0
        return slot

    def release(self, slot: int) -> None:
        """Give a slot back (idempotent, so a finalizer and an explicit close can both call it)."""
        if slot not in self.free:
            self.free.append(slot)

    def crop(self, slot: int, length: int) -> None:
        if not 0 <= length <= self.lengths[slot]:
            raise ValueError(f"cannot crop a cache of {self.lengths[slot]} tokens to {length}")
        self.lengths[slot] = length

    def write(self, layer: int, slots: torch.Tensor, positions: torch.Tensor,
              k: torch.Tensor, v: torch.Tensor) -> None:
        """Token i's key / value go to ``slots[i]`` at ``positions[i]``; k, v: [N, kv_heads,
        head_dim], rounded to the caches' dtype (lengths move in ``advance``)."""
        self.k[layer][slots, :, positions] = k.to(self.dtype)
        self.v[layer][slots, :, positions] = v.to(self.dtype)

    def advance(self, slot: int, n: int) -> None:
        self.lengths[slot] += n
        self.clean[slot] = max(self.clean[slot], self.lengths[slot])

    def ensure_clean(self, slot: int, upto: int) -> None:
        """Make positions < upto finite (zero those never written) before a padded read."""
        lo = self.clean[slot]
        if lo < upto:  # zero ahead too, so a growing batch does not come back every step
            upto = min(self.max_len, max(upto, lo + CLEAN_AHEAD))
            for cache in (*self.k, *self.v):
                cache[slot, :, lo:upto] = 0
            self.clean[slot] = upto

    def keep(self, slot: int, start: int, indices: list[int]) -> None:
        """Compact a verified tree branch: positions start + indices[i] move to start + i and the
        slot ends there (a tree verify writes every node; only the accepted path stays)."""
        src = torch.tensor([start + i for i in indices], dtype=torch.long)
        end = start + len(indices)
        for cache in (*self.k, *self.v):
            cache[slot, :, start:end] = cache[slot, :, src]
        self.crop(slot, end)
