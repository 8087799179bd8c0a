"""The x86 backend: the plan's linears, attention and element-wise steps on this CPU's kernels
(``backend.Backend``'s refinement; ``plan.resolve_kinds`` decided which)."""

from __future__ import annotations

import logging

import torch

from specdec.runtime.backend import Backend, Linear
from specdec.runtime.x86 import fused, int8
from specdec.runtime.x86.attention import FittedSdpa, InvariantAttention, KernelAttention
from specdec.runtime.x86.invariance import invariant_rows
from specdec.runtime.x86.linears import (
    Int8Linear,
    OneDnnLinear,
    PanelLinear,
    QuantizedLinear,
    decodes,
)

log = logging.getLogger(__name__)


class X86Backend(Backend):
    name = "x86"

    def __init__(self, plan):
        if plan.attention == "kernel":
            attention = KernelAttention(plan.isa)
        else:
            attention = FittedSdpa() if plan.attention == "sdpa" else InvariantAttention(plan.attention)
        super().__init__(attention)
        self.plan = plan
        self.invariant_by_pieces = plan.batch_invariant and plan.dtype == "bfloat16"
        self.reads_float16_caches = plan.attention == "kernel"
        self.runs_codes = plan.linears in ("int8", "quantized")
        self.fused = plan.fused
        self.ops = fused.ops(plan.isa) if plan.fused else None  # bound once: called every layer

    def linear(self, w: torch.Tensor, bias, blocks=None, name: str = "") -> Linear:
        kind = self.plan.linears
        if kind in ("int8", "quantized") and not decodes(w, blocks, name):
            # a weight without codes that decode to it exactly (logged): float32 panels, or
            # oneDNN's linear where they do not run (no AVX-512 kernels)
            kind = "panels" if self.plan.isa == "avx512" else "onednn"
        if kind == "int8":
            return Int8Linear(w, bias, int8.pack(blocks, w.shape[0]), self.plan.isa)
        if kind == "quantized":
            return QuantizedLinear(w, bias, blocks)
        if kind == "panels":
            return PanelLinear(w, bias)
        if kind == "onednn":
            return OneDnnLinear(w, bias, row_copy=w.dtype == torch.float32)
        return Linear(w, bias)

    def prepare(self, weights) -> None:
        """bfloat16: the most rows a linear takes at once with each row's outputs its own."""
        if self.invariant_by_pieces:
            self.rows = invariant_rows(weights)
            log.info("batch invariant: linears in pieces of %d rows, %s attention", self.rows,
                     self.attention.kind)

    def norm(self, x, w, eps):
        return self.ops.rms_norm(x, w, eps) if self.fused else super().norm(x, w, eps)

    def silu_mul(self, gate_up):
        return self.ops.silu_mul(gate_up) if self.fused else super().silu_mul(gate_up)

    def fuses_rope(self, head_dim: int) -> bool:
        return self.fused and fused.rope_fits(head_dim)

    def rope_write(self, qkv, cos, sin_signed, k_cache, v_cache, slots, positions, heads):
        return self.ops.rope_write(qkv, cos, sin_signed, k_cache, v_cache, slots, positions, heads)
