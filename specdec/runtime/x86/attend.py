"""specdec's float32 attention of a pass's short rows on x86 CPUs (``attend.cpp``, built for
AVX-512 or AVX2: ``kernels.ISAS``; the two builds' outputs are bitwise the same).

Why: SDPA's CPU kernel packs each head's keys and values per call, and padded groups need a
mask, so a pass's attention grew far faster than its work as rows were added; here each row
reads its slot in place (docs/RESULTS.md, "Runtime").

What: each layer's short rows (decodes and verifies, ``model.SHORT`` tokens at most) attend in
one call, every row reading its KV slot in place: no padding, no mask tensor, no group plan.
Each token's result is computed over exactly the keys it sees, in the order of their positions
(``attend.cpp``), so it is bitwise the same in any batch; with the panel linear float32 passes
are then batch invariant for decodes and verifies, and speculative decoding in float32 commits
exactly the tokens plain decoding does. A long prompt chunk keeps SDPA's causal attention.

It is built as ``kernels`` says; ``unavailable()`` says why it cannot run here, or returns None
when it can.
"""

from __future__ import annotations

from pathlib import Path

import torch
import torch.nn.functional as F

from specdec.runtime.x86 import kernels

SOURCE = Path(__file__).with_name("attend.cpp")
HEAD_DIMS = (16, 32, 64, 128)  # as in attend.cpp


def unavailable(head_dim: int | None = None, isa: str = "avx512") -> str | None:
    """Why the kernel built for ``isa`` cannot run here (for this head dim, if given), or None
    when it can."""
    if head_dim is not None and head_dim not in HEAD_DIMS:
        return f"its head dims are {HEAD_DIMS}, not {head_dim}"
    return kernels.unavailable(SOURCE, isa)


def kernel(isa: str = "avx512"):
    """The extension built for ``isa`` (its ``attend`` is ``attend`` below without this
    lookup: what the backend binds once)."""
    return kernels.build(SOURCE, isa=isa)


def attend(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, rows: torch.Tensor,
           seen: torch.Tensor, scale: float, isa: str = "avx512") -> torch.Tensor:
    """q [N, h, d]: the short rows' new tokens, flat, against the caches [slots, kvh, L, d],
    float32 or float16 (read exactly as float32; ``model.cache_dtype``), every new key / value
    written already; rows [R, 4] int64: (first flat token, new tokens,
    slot, cached tokens) of each row; seen [N, S] uint8: which of its row's new tokens each
    token sees (empty: causal). Returns [N, h * d]; on the build for ``isa``."""
    return kernel(isa).attend(q, k_cache, v_cache, rows, seen, scale)


def main() -> None:
    """Build the kernel for each ISA now and check it against SDPA on two rows
    (``kernels.main``)."""
    gen = torch.Generator().manual_seed(0)
    k, v = (torch.randn(2, 2, 40, 64, generator=gen) for _ in "kv")
    q = torch.randn(4, 6, 64, generator=gen)  # a decode (slot 0, 30 cached), a verify of 3
    want = [F.scaled_dot_product_attention(q[i][:, None], k[b, :, :c],
                                           v[b, :, :c], scale=0.125, enable_gqa=True)
            .reshape(1, -1) for i, b, c in ((0, 0, 31), (1, 1, 21), (2, 1, 22), (3, 1, 23))]
    for isa in kernels.built_isas("attention kernel", lambda i: unavailable(isa=i)):
        got = attend(q, k, v, torch.tensor([[0, 1, 0, 30], [1, 3, 1, 20]]), torch.empty(0),
                     0.125, isa)
        assert torch.allclose(got, torch.cat(want), atol=1e-5), \
            f"the attention kernel ({isa}) is wrong here"
        print(f"specdec attention kernel ({isa}): built and checked ({SOURCE.name})")
