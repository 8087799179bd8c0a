"""specdec's float32 linear on x86 CPUs with AVX-512: the weight held as panels of 16 outputs,
streamed once per call whatever the number of rows (``panels.cpp``).

Why: a float32 decode step streams the whole weight from memory, and a pass of a few rows
should cost what one row costs; oneDNN's and MKL's linears repack or re-read the weight per
row block, the panels stream it once (docs/RESULTS.md, "Runtime").

Every output is the same chain of fused multiply-adds over the inputs, so a row's outputs are
bitwise its outputs alone, in any batch.

It is built as ``kernels`` says (``make kernels``); ``unavailable()`` says why it cannot run
here, or returns None when it can.
"""

from __future__ import annotations

import functools
from pathlib import Path

import torch

from specdec.runtime.x86 import kernels

SOURCE = Path(__file__).with_name("panels.cpp")
WIDTH, PANELS = 16, 2  # as in panels.cpp: outputs a panel holds; panels a task owns


@functools.cache
def _build():
    """The compiled extension, or the reason it cannot be had here (a str)."""
    ext = kernels.build(SOURCE)
    if not isinstance(ext, str):
        assert (ext.WIDTH, ext.PANELS) == (WIDTH, PANELS), "panels.py and panels.cpp disagree"
    return ext


def unavailable() -> str | None:
    """Why the panel kernel cannot run here, or None when it can."""
    built = _build()
    return built if isinstance(built, str) else None


def usable(w: torch.Tensor) -> bool:
    """Whether ``w`` [out, in] can run on the panels here (a CPU float32 weight); logs once why
    not when the kernel is missing."""
    return kernels.usable(SOURCE, w.dtype, w.device, "float32 panel linear",
                          "oneDNN's and MKL's linears, slower over a few rows")


def pack(w: torch.Tensor) -> torch.Tensor:
    """``w`` [out, in] as panels [P, in, 16]: P a multiple of ``PANELS``, outputs past ``out``
    zero."""
    out, inputs = w.shape
    padded = -(-out // (WIDTH * PANELS)) * WIDTH * PANELS
    full = w.new_zeros(padded, inputs)
    full[:out] = w
    return full.view(padded // WIDTH, WIDTH, inputs).transpose(1, 2).contiguous()


def linear(x: torch.Tensor, panels: torch.Tensor, out: int,
           bias: torch.Tensor | None = None) -> torch.Tensor:
    """x [..., in] -> [..., out], on the panels of ``pack``."""
    y = _build().linear(x.reshape(-1, x.shape[-1]), panels, out, bias)
    return y.view(*x.shape[:-1], out)


def main() -> None:
    """Build the kernel now and check it on one product (``kernels.main``)."""
    reason = unavailable()
    if reason:
        print(f"specdec panel linear: not built ({reason}); float32 uses oneDNN's and MKL's")
    else:
        w, x = torch.randn(100, 37, dtype=torch.float64), torch.randn(5, 37, dtype=torch.float64)
        got = linear(x.float(), pack(w.float()), 100).double()
        assert torch.allclose(got, x @ w.T, atol=1e-4), "the panel linear is wrong here"
        print(f"specdec panel linear: built and checked ({SOURCE.name})")
