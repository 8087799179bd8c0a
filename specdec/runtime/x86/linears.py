"""The x86 backend's linear variants, one class each, chosen once at load by the plan.

- ``Int8Linear``: the GGUF's codes times int8 rows (``int8``, its AVX-512 VNNI or AVX2 build, as
  the plan's ``isa`` says; llama.cpp's numerics, not float32's; every row's outputs its outputs
  alone, bitwise the same from either build).
- ``QuantizedLinear``: the float32 panels and the GGUF's codes as panels (``qpanels``): passes of
  at most ``qpanels.ROWS`` rows decode the codes in registers, longer ones read the panels;
  bitwise the same outputs, float32's numerics.
- ``PanelLinear``: the float32 weight as panels of 16 outputs (``panels``): a pass streams the
  weight once whatever its rows; each row's outputs its outputs alone.
- ``OneDnnLinear``: oneDNN's linear on a copy reordered once into its blocked layout (a
  multi-row pass does not repack the weight per call); float32 also keeps an ``[in, out]`` copy
  for one-row passes (a GEMV), where MKL's ``F.linear`` over one row is slower.

Each keeps ``w`` [out, in], the model's own storage, and the copies it runs on; the choice
between the variants is by measurement (docs/RESULTS.md, "Runtime").
"""

from __future__ import annotations

import logging

import torch

from specdec.models.gguf_blocks import Blocks
from specdec.runtime.backend import Linear
from specdec.runtime.x86 import int8, panels, qpanels

log = logging.getLogger(__name__)


class Int8Linear(Linear):
    kind = "int8"

    def __init__(self, w, bias, codes: int8.Codes, isa: str = "avx512"):
        super().__init__(w, bias)
        self.codes = codes  # ``int8.pack`` of w's GGUF blocks
        self.isa = isa  # the kernel's build: avx512 | avx2 (``kernels.ISAS``)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return int8.linear(x, self.codes, self.bias, isa=self.isa)


class PanelLinear(Linear):
    kind = "panels"

    def __init__(self, w, bias):
        super().__init__(w, bias)
        self.panels = panels.pack(w)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return panels.linear(x, self.panels, self.w.shape[0], self.bias)


class QuantizedLinear(PanelLinear):
    kind = "quantized"

    def __init__(self, w, bias, blocks: Blocks):
        super().__init__(w, bias)
        self.codes = qpanels.pack(blocks, w.shape[0])

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if x.numel() <= qpanels.ROWS * x.shape[-1]:
            return qpanels.linear(x, self.codes, self.w.shape[0], self.bias)
        return super().__call__(x)


class OneDnnLinear(Linear):
    kind = "onednn"

    def __init__(self, w, bias, row_copy: bool):
        super().__init__(w, bias)
        self.packed = packed_weight(w) if can_pack(w) else None
        self.wt = w.t().contiguous() if row_copy else None  # [in, out]

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if self.wt is not None and x.numel() == x.shape[-1]:  # one row
            y = x @ self.wt
            return y if self.bias is None else y + self.bias
        if self.packed is not None:
            return torch.ops.mkldnn._linear_pointwise(x, self.packed, self.bias, "none", [], "")
        return super().__call__(x)


def can_pack(w: torch.Tensor) -> bool:
    """Whether oneDNN can hold ``w`` packed here (a CPU float32 weight, or a bfloat16 one where
    oneDNN runs bfloat16)."""
    if w.device.type != "cpu" or not torch.backends.mkldnn.is_available():
        return False
    if not hasattr(torch.ops.mkldnn, "_reorder_linear_weight"):
        return False
    if w.dtype == torch.bfloat16:
        return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    return w.dtype == torch.float32


def packed_weight(w: torch.Tensor) -> torch.Tensor:
    """``w`` [out, in] reordered into oneDNN's layout."""
    return torch.ops.mkldnn._reorder_linear_weight(w.contiguous())


def decodes(w: torch.Tensor, blocks: Blocks | None, name: str) -> bool:
    """Whether there are GGUF blocks of w that decode bitwise to it; logged when not (w then
    runs on float32 panels)."""
    if blocks is None:
        log.warning("%s has no GGUF blocks: it runs on float32 panels", name)
        return False
    if not blocks.decode_to(w):
        log.warning("%s: its GGUF blocks do not decode to its weight: it runs on float32 panels",
                    name)
        return False
    return True
