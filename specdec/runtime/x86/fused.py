"""specdec's fused float32 element-wise ops on x86 CPUs (``fused.cpp``, built for AVX-512 or AVX2:
``kernels.ISAS``; the two builds' outputs are bitwise the same): the RMSNorm, RoPE with the
write of the new keys and values into the KV pool, and silu(gate) * up.

Why: with the linears and the short rows on specdec's kernels, torch's element-wise ops were a
visible share of a float32 pass, most of it per-op overhead (an RMSNorm is 6 ops, RoPE and the
KV write 8); each fused op is one call over the pass's tokens (docs/RESULTS.md, "Runtime").

Each computes a token from its own inputs in a fixed order, so a token's outputs are bitwise
the same in any batch, as the kernels' are. RoPE rounds as eager float32 does; the norm's sum
of squares is summed in another order than torch's, so its outputs differ from the eager ones
in the last bits.

It is built as ``kernels`` says; ``unavailable()`` says why it cannot run here, or returns None
when it can.
"""

from __future__ import annotations

from pathlib import Path

import torch

from specdec.runtime.x86 import kernels

SOURCE = Path(__file__).with_name("fused.cpp")


def unavailable(isa: str = "avx512") -> str | None:
    """Why the fused ops built for ``isa`` cannot run here, or None when they can."""
    return kernels.unavailable(SOURCE, isa)


def rope_fits(head_dim: int) -> bool:
    """Whether ``rope_write`` takes this head dim (its halves whole 16-float vectors)."""
    return head_dim % 32 == 0


def ops(isa: str = "avx512"):
    """The extension built for ``isa``: its ``rms_norm``, ``rope_write`` and ``silu_mul`` are the
    functions below without this lookup (what the backend binds once)."""
    return kernels.build(SOURCE, isa=isa)


def rms_norm(x: torch.Tensor, w: torch.Tensor, eps: float, isa: str = "avx512") -> torch.Tensor:
    """x [N, H] -> w * (x / sqrt(mean(x^2) + eps)), on the build for ``isa`` (so each op)."""
    return ops(isa).rms_norm(x, w, eps)


def rope_write(qkv: torch.Tensor, cos: torch.Tensor, sin_signed: torch.Tensor,
               k_cache: torch.Tensor, v_cache: torch.Tensor, slots: torch.Tensor,
               positions: torch.Tensor, heads: int, isa: str = "avx512") -> torch.Tensor:
    """qkv [N, (h + 2 kvh) d] -> the queries with RoPE [N, h, d]; the keys (with RoPE) and the
    values go into the caches at (``slots[i]``, ``positions[i]``). cos / sin_signed: each
    token's RoPE rows [N, d] (``model.rope``)."""
    return ops(isa).rope_write(qkv, cos, sin_signed, k_cache, v_cache, slots, positions, heads)


def silu_mul(gate_up: torch.Tensor, isa: str = "avx512") -> torch.Tensor:
    """gate_up [N, 2I] -> silu(gate) * up [N, I]."""
    return ops(isa).silu_mul(gate_up)


def main() -> None:
    """Build the ops for each ISA now and check them against torch's on a few rows
    (``kernels.main``)."""
    gen = torch.Generator().manual_seed(0)
    x, w = torch.randn(3, 40, generator=gen), torch.randn(40, generator=gen)
    norm = w * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-5))
    g = torch.randn(3, 80, generator=gen)
    silu = torch.nn.functional.silu(g[:, :40]) * g[:, 40:]
    for isa in kernels.built_isas("fused ops", unavailable):
        assert torch.allclose(rms_norm(x, w, 1e-5, isa), norm, atol=1e-5), \
            f"the fused RMSNorm ({isa}) is wrong here"
        assert torch.allclose(silu_mul(g, isa), silu, atol=1e-5), \
            f"the fused silu * up ({isa}) is wrong here"
        print(f"specdec fused ops ({isa}): built and checked ({SOURCE.name})")
