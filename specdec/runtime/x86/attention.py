"""How the x86 backend's short rows attend, one class per way (``backend.Attention``'s refinements).

- ``FittedSdpa``: SDPA by padded groups, split by a cost model fitted on this backend's SDPA
  (``ATTENTION_COST``); only how rows are grouped follows it, never what a token computes.
- ``KernelAttention``: specdec's float32 kernel (``attend``, on the plan's ISA): every short row
  reads its slot in place, unpadded, from one table; each token's result is its result alone
  (batch invariant).
- ``InvariantAttention``: grouped or per-query SDPA over whole key blocks, on one thread
  (``invariance``), for passes made batch invariant without the kernel (bfloat16).
"""

from __future__ import annotations

import torch

from specdec.runtime.backend import Attention
from specdec.runtime.x86 import attend
from specdec.runtime.x86.invariance import INVARIANTS, KEY_BLOCK, one_thread

# SDPA's time for one group, in microseconds, as 1, B, B*T, B*C and B*T*C weigh in it (B rows,
# T queries and C keys each, padded): a least-squares fit of the grouped attention over B 1-8,
# T 1-16 and C 128-512 at SmolLM2-135M's heads (median error 4%; docs/RESULTS.md, "Runtime").
ATTENTION_COST = (23.7, 0.52, 0.37, 0.025, 0.0059)


class FittedSdpa(Attention):
    def cost(self, B: int, T: int, C: int) -> float:
        one, per_row, per_query, per_key, per_score = ATTENTION_COST
        return one + B * (per_row + per_query * T + per_key * C + per_score * T * C)


class KernelAttention(Attention):
    kind = "kernel"
    table = True

    def __init__(self, isa: str):
        self.kernel = attend.kernel(isa)  # bound once: a pass calls it in every layer

    def attend_table(self, q, k_cache, v_cache, table, scale) -> torch.Tensor:
        """q [N, h, d] of every short row against the caches; returns [N, h * d]."""
        return self.kernel.attend(q, k_cache, v_cache, *table, scale)


class InvariantAttention(FittedSdpa):
    key_block = KEY_BLOCK

    def __init__(self, kind: str):
        self.kind, self.way = kind, INVARIANTS[kind]

    def lay_out(self, mask, kv_heads, per_kv, dtype):
        return self.way.mask(mask, kv_heads, per_kv, dtype)

    def attend(self, queries, keys, values, mask, scale):
        with one_thread():  # as the probe ran it (``invariance``)
            return self.way.attend(queries, keys, values, mask, scale)
