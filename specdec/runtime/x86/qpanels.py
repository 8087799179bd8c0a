"""The float32 panel linear run from GGUF's quantized blocks (``panels.cpp``'s ``qlinear``).

Why: a float32 decode streams the whole float32 weight from memory (540 MB for SmolLM2-135M),
and on 2-core CPUs a pass of a few rows costs about that stream. The GGUF the model comes from
holds its linears as Q4_1 and its lm_head as Q8_0 (``specdec.models.gguf_blocks``): 85 MB. Here
the linear keeps those codes, laid out as the panels are, and decodes them to float32 in
registers: the products are the float32 panel linear's own, over the same float32 weights
(GGUF's dequantization, which is what transformers loads), so its outputs are bitwise the
float32 panels' and serving commits the same tokens. Decoding is not free (about what 4 rows'
products cost), so a projection keeps both copies and runs passes of at most ``ROWS`` rows on
the codes, longer ones on the float32 panels; bitwise equal, the switch never shows.

``pack`` lays a weight's blocks out as panels; ``dequantize`` decodes that layout in torch, and
``matches`` compares it bitwise with the float32 panels of a weight (the tests' check of
``pack``). At load the blocks themselves are checked against the weight
(``gguf_blocks.Blocks.decode_to``) before the model runs on them.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from specdec.models.gguf_blocks import BLOCK, Blocks, halves
from specdec.runtime.x86 import panels

# The most rows a pass runs on the codes; longer ones run on the float32 panels: up to about 5
# rows the float32 panels' products hide under their stream from memory (docs/RESULTS.md).
ROWS = 4


@dataclass(frozen=True)
class QPanels:
    """A weight's codes as panels: ``codes`` uint8 [P, in, 8 (Q4_1) or 16 (Q8_0)], ``scales``
    float16 [P, in / 32, 2 (d, m) or 1 (d), 16]; P a multiple of ``panels.PANELS``."""

    format: str
    codes: torch.Tensor
    scales: torch.Tensor

    @property
    def inputs(self) -> int:
        return self.codes.shape[1]


def pack(blocks: Blocks, out: int) -> QPanels:
    """The panels of a weight [out, in] held as GGUF blocks (``blocks.data`` [out, in/32 * size]);
    outputs past ``out`` up to the panels' width are zero."""
    padded = -(-out // (panels.WIDTH * panels.PANELS)) * panels.WIDTH * panels.PANELS
    full = blocks.by_block(out, padded)
    nb = full.shape[1]
    P = padded // panels.WIDTH

    def by_panel(per_output: torch.Tensor) -> torch.Tensor:  # [padded, n, ...] -> [P, n, 16, ...]
        return per_output.view(P, panels.WIDTH, *per_output.shape[1:]).transpose(1, 2)

    def half(at: int) -> torch.Tensor:  # the float16 at byte ``at`` of every block: [P, nb, 16]
        return by_panel(halves(full, at))

    if blocks.format == "Q4_1":
        nibbles = full[..., 4:]  # [padded, nb, 16]: byte j holds inputs j (low) and j + 16
        q = torch.cat([nibbles & 0xF, nibbles >> 4], dim=-1).view(padded, nb * BLOCK)
        q = by_panel(q)  # [P, in, 16]
        codes = q[..., 0::2] | (q[..., 1::2] << 4)  # output 2i in byte i's low nibble
        scales = torch.stack([half(0), half(2)], dim=2)
    else:
        codes = by_panel(full[..., 2:].reshape(padded, nb * BLOCK))  # int8 codes as bytes
        scales = half(0)[:, :, None]
    return QPanels(blocks.format, codes.contiguous(), scales.contiguous())


def dequantize(w: QPanels) -> torch.Tensor:
    """The float32 panels [P, in, 16] the codes stand for, as GGUF defines them (d * q, + m)."""
    P, inputs = w.codes.shape[:2]
    d = w.scales[:, :, 0].float().repeat_interleave(BLOCK, dim=1)  # [P, in, 16]
    if w.format == "Q4_1":
        q = torch.stack([w.codes & 0xF, w.codes >> 4], dim=-1).view(P, inputs, panels.WIDTH)
        return d * q.float() + w.scales[:, :, 1].float().repeat_interleave(BLOCK, dim=1)
    return d * w.codes.view(torch.int8).float()


def matches(w: QPanels, weight: torch.Tensor) -> bool:
    """Whether the codes decode bitwise to ``weight`` [out, in] (signed zeros included)."""
    want = panels.pack(weight)
    got = dequantize(w)
    return got.shape == want.shape and torch.equal(got.view(torch.int32), want.view(torch.int32))


def linear(x: torch.Tensor, w: QPanels, out: int, bias: torch.Tensor | None = None) -> torch.Tensor:
    """x [..., in] -> [..., out], bitwise ``panels.linear`` on the dequantized weight."""
    y = panels._build().qlinear(x.reshape(-1, x.shape[-1]), w.codes, w.scales, out, bias)
    return y.view(*x.shape[:-1], out)
