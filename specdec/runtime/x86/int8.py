"""specdec's linear on GGUF codes times int8 activations, as llama.cpp runs a quantized model on
a CPU (``int8.cpp``, built for AVX-512 VNNI or for AVX2: ``kernels.ISAS``).

Why: every row of a pass past a few costs its float32 multiply-adds, and a prompt's prefill, a
verify's drafts and a batch's requests are all rows. An integer dot product (``vpdpbusd``)
does 64 byte products a vector where a float32 fused multiply-add does 16 (AVX2: 32 products
in two steps, ``vpmaddubsw`` and ``vpmaddwd``, where an FMA does 8). So each row is
quantized per block of 32 inputs to int8 (scale max |x| / 127), and every block's product is
exact in integers, scaled once by the weight's and the row's scales: GGUF's Q4_1 and Q8_0
blocks times llama.cpp's Q8 rows.

These are other numerics than the float32 linears' (logits move by up to about 1; greedy
outputs part from float32's at near-ties), which the plan says (``numerics``); ``linears:
quantized`` keeps float32's numerics bitwise. Within them a row's outputs are bitwise its
outputs alone, in any batch: speculative decoding on them commits the tokens that plain
decoding on them does.

The AVX2 build (``isa="avx2"``, for CPUs without AVX-512 VNNI; it runs on those with it too) is
the same source on AVX2 vectors (``lanes.h``): its integer sums are exact and its float terms
the same operations in the same order, so its outputs are bitwise the AVX-512 build's.

On a CPU with AMX (amx_int8), passes of ``AMX_ROWS`` rows or more take each block's integer sums
for 16 rows from one tile product; the float terms after it are the same, so the outputs are
bitwise the ``vpdpbusd`` path's (shorter passes keep ``vpdpbusd``, faster there). Timings:
docs/RESULTS.md, "Runtime".

``pack`` lays a weight's GGUF blocks out for the kernel; ``reference`` is the same product in
float64 from torch's integer matmuls, for tests.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from pathlib import Path

import torch

from specdec.models.gguf_blocks import BLOCK, FORMATS, Blocks, halves
from specdec.runtime.x86 import kernels

SOURCE = Path(__file__).with_name("int8.cpp")
# CPU features int8.cpp is compiled for beyond each ISA's, and those it uses where the CPU has
# them (checked there)
NEEDS = {"avx512": ("avx512bw", "avx512_vnni"), "avx2": ()}  # per ISA of ``kernels.ISAS``
MAY_USE = {"avx512": ("amx_tile", "amx_int8"), "avx2": ()}
AMX_ROWS = 16  # passes of at least this many rows run on AMX tiles where the CPU has them
WIDTH = 16  # as in int8.cpp: outputs a panel holds


@functools.cache
def _build(isa: str = "avx512"):
    """The extension compiled for ``isa``, or the reason it cannot be had here (a str)."""
    ext = kernels.build(SOURCE, NEEDS.get(isa, ()), MAY_USE.get(isa, ()), isa)  # it checks isa
    if not isinstance(ext, str):
        assert (ext.WIDTH, ext.BLOCK, ext.ISA) == (WIDTH, BLOCK, isa), \
            "int8.py and int8.cpp disagree"
    return ext


def unavailable(isa: str = "avx512") -> str | None:
    """Why the int8 kernel built for ``isa`` cannot run here, or None when it can."""
    built = _build(isa)
    return built if isinstance(built, str) else None


@dataclass(frozen=True)
class Codes:
    """A weight's GGUF codes laid out for ``int8.cpp``: ``codes`` uint8 [P, in / 32, 256 (Q4_1)
    or 512 (Q8_0)], ``scales`` float16 [P, in / 32, 2 (d, m) or 1 (d), 16]."""

    format: str
    codes: torch.Tensor
    scales: torch.Tensor
    out: int


def pack(blocks: Blocks, out: int) -> Codes:
    """The kernel's layout of a weight [out, in] held as GGUF blocks (``blocks.data``
    [out, in/32 * size]); outputs past ``out`` up to a whole panel are zero."""
    padded = -(-out // WIDTH) * WIDTH
    full = blocks.by_block(out, padded)
    nb = full.shape[1]
    P = padded // WIDTH

    def half(at: int) -> torch.Tensor:  # the float16 at byte ``at`` of every block: [P, nb, 16]
        return halves(full, at).view(P, WIDTH, nb).transpose(1, 2)

    def lanes(q: torch.Tensor, groups: int) -> torch.Tensor:  # [padded, nb, 4 g] -> [P, nb, 64 g]
        q = q.reshape(P, WIDTH, nb, groups, 4)  # [panel, output j, block, group g, input t]
        return q.permute(0, 2, 3, 1, 4).reshape(P, nb, groups * 4 * WIDTH)

    if blocks.format == "Q4_1":
        # GGUF's byte i holds input i (low nibble) and i + 16 (high): the kernel's own byte
        codes = lanes(full[..., 4:], 4)
        scales = torch.stack([half(0), half(2)], dim=2)
    else:
        codes = lanes(full[..., 2:] ^ 0x80, 8)  # the signed codes plus 128, as bytes
        scales = half(0)[:, :, None]
    return Codes(blocks.format, codes.contiguous(), scales.contiguous(), out)


def amx() -> bool:
    """Whether the kernel (the AVX-512 build) runs passes of ``AMX_ROWS`` rows or more on AMX
    tiles here."""
    return unavailable() is None and _build().amx_ready()


def linear(x: torch.Tensor, w: Codes, bias: torch.Tensor | None = None,
           amx_rows: int | None = None, isa: str = "avx512") -> torch.Tensor:
    """x [..., in] float32 -> [..., out]: each row quantized to int8 per block, times the codes,
    on the build for ``isa``; passes of at least ``amx_rows`` rows (0: none) take the integer
    sums from AMX tiles where the CPU has them (None: ``AMX_ROWS``; the AVX-512 build), bitwise
    the same outputs. (The runtime's rows come flat, [N, in], and go straight through: a pass
    makes ~120 calls.)"""
    amx_rows = AMX_ROWS if amx_rows is None else amx_rows
    ext = _build(isa)
    if x.dim() == 2:
        return ext.linear(x, w.codes, w.scales, w.out, bias, amx_rows)
    y = ext.linear(x.reshape(-1, x.shape[-1]), w.codes, w.scales, w.out, bias, amx_rows)
    return y.view(*x.shape[:-1], w.out)


def quantize_rows(x: torch.Tensor, isa: str = "avx512"):
    """x [M, in]'s rows as the linear (built for ``isa``) quantizes them: codes int8 [M, in],
    and per block of 32 the scale, scale times the codes' sum, the codes' sum."""
    return _build(isa).quantize_rows(x)


def reference(x: torch.Tensor, blocks: Blocks, out: int, isa: str = "avx512") -> torch.Tensor:
    """``linear`` in float64 from exact integer products: per block dw * da * sum(q * qa) +
    mw * da * sum(qa), summed over the blocks; it differs from the kernel's float32 only by the
    rounding of the sums' terms."""
    qa, da, _, _ = quantize_rows(x.reshape(-1, x.shape[-1]).float(), isa)
    qw, dw, mw = blocks.codes(out)
    M, nb = da.shape
    ints = torch.einsum("mbk,obk->mob", qa.long().view(M, nb, BLOCK), qw.view(out, nb, BLOCK))
    sums = qa.long().view(M, nb, BLOCK).sum(-1)  # [M, nb]
    d = da.double()
    y = (ints.double() * dw.double()[None] * d[:, None]).sum(-1) + (
        mw.double()[None] * (d * sums.double())[:, None]).sum(-1)
    return y.view(*x.shape[:-1], out)


def main() -> None:
    """Build the kernel for each ISA now and check it on one product (``kernels.main``)."""
    for isa in kernels.built_isas("int8 linear", unavailable):
        gen = torch.Generator().manual_seed(0)
        for fmt in FORMATS:
            blocks = random_blocks(fmt, 40, 64, gen)
            x = torch.randn(5, 64, generator=gen)
            got = linear(x, pack(blocks, 40), isa=isa).double()
            assert torch.allclose(got, reference(x, blocks, 40, isa), rtol=1e-5, atol=1e-5), \
                f"the int8 linear ({isa}) is wrong here ({fmt})"
        print(f"specdec int8 linear ({isa}): built and checked ({SOURCE.name})")


def random_blocks(fmt: str, out: int, inputs: int, gen: torch.Generator) -> Blocks:
    """GGUF blocks of a random weight [out, in] in ``fmt`` (for checks and tests): codes of every
    value, scales about 0.01."""
    nb = inputs // BLOCK
    d = (torch.rand(out, nb, 1, generator=gen) * 0.02 + 0.001).half().view(torch.uint8)
    if fmt == "Q4_1":
        m = (-torch.rand(out, nb, 1, generator=gen) * 0.1).half().view(torch.uint8)
        qs = torch.randint(0, 256, (out, nb, 16), generator=gen, dtype=torch.uint8)
        data = torch.cat([d, m, qs], dim=-1)
    else:
        qs = torch.randint(-127, 128, (out, nb, 32), generator=gen, dtype=torch.int8)
        data = torch.cat([d, qs.view(torch.uint8)], dim=-1)
    return Blocks(fmt, data.reshape(out, -1))
