"""specdec's float32 linear on x86 CPUs with AVX-512: the weight held as panels of 16 outputs,
streamed once per call whatever the number of rows (``panels.cpp``).

Why: on a 2-core Xeon with AVX-512 and no AMX, where float32 is served, a decode step streams
the float32 weights from memory (540 MB for SmolLM2-135M against a 260 MiB L3) and a pass of a
few rows should cost what one row costs. oneDNN's and MKL's linears did not: the linears of a
pass of 8 rows took 30.6 ms on oneDNN's packed copy against 16.8 for one row on the ``[in, out]``
copy. On the panels they took 24.6 ms, one row 16.0, and 32 rows 50.1 against 56.4; at 128 rows
they tie, and a 256-token prompt chunk's whole pass is 6% slower (docs/benchmarks/panels/,
2026-12-04).

Every output is the same chain of fused multiply-adds over the inputs, so a row's outputs are
bitwise its outputs alone, in any batch.

The extension is compiled on first use with the machine's C++ compiler, through
``torch.utils.cpp_extension``. The build lands in torch's extension cache and takes about 25 s
on 2 cores; ``make setup`` runs it (``make panels``: ``main`` below), so serving starts
warm. ``unavailable()`` says why the kernel cannot run here, or returns None when it can.
"""

from __future__ import annotations

import functools
import logging
import platform
from pathlib import Path

import torch

SOURCE = Path(__file__).with_name("panels.cpp")
WIDTH, PANELS = 16, 2  # as in panels.cpp: outputs a panel holds; panels a task owns
FLAGS = ["-O3", "-mavx512f", "-mfma", "-fopenmp"]  # OpenMP: at::parallel_for's threads, which
# resolve to the libgomp torch already loaded, so torch.set_num_threads bounds them

log = logging.getLogger(__name__)


def cpu_flags() -> set[str]:
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return set()
    line = next((line for line in text.splitlines() if line.startswith("flags")), "")
    return set(line.partition(":")[2].split())


@functools.cache
def _build():
    """The compiled extension, or the reason it cannot be had here (a str)."""
    if platform.machine() not in ("x86_64", "AMD64"):
        return f"the CPU is {platform.machine()}, not x86-64"
    if "avx512f" not in cpu_flags():
        return "the CPU has no AVX-512"
    try:
        from torch.utils.cpp_extension import load
        ext = load("specdec_panels", [str(SOURCE)], extra_cflags=FLAGS,
                   extra_ldflags=["-fopenmp"], verbose=False)
    except Exception as e:  # no compiler, a failed build: the caller says so and goes on
        return f"building {SOURCE.name} failed: {type(e).__name__}: {e}"
    assert (ext.WIDTH, ext.PANELS) == (WIDTH, PANELS), "panels.py and panels.cpp disagree"
    return ext


def unavailable() -> str | None:
    """Why the panel kernel cannot run here, or None when it can."""
    built = _build()
    return built if isinstance(built, str) else None


def usable(w: torch.Tensor) -> bool:
    """Whether ``w`` [out, in] can run on the panels here (a CPU float32 weight); logs once why
    not when the kernel is missing."""
    if w.dtype != torch.float32 or w.device.type != "cpu":
        return False
    reason = unavailable()
    if reason:
        _warn(reason)
    return reason is None


@functools.cache
def _warn(reason: str) -> None:
    log.warning("specdec's float32 panel linear is off (%s); float32 runs oneDNN's and MKL's "
                "linears, slower over a few rows", reason)


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
    """Build the kernel now and check it on one product (``make panels``), so the first model
    load does not wait for the build."""
    reason = unavailable()
    if reason:
        print(f"specdec panel linear: not built ({reason}); float32 uses oneDNN's and MKL's")
    else:
        w, x = torch.randn(100, 37, dtype=torch.float64), torch.randn(5, 37, dtype=torch.float64)
        got = linear(x.float(), pack(w.float()), 100).double()
        assert torch.allclose(got, x @ w.T, atol=1e-4), "the panel linear is wrong here"
        print(f"specdec panel linear: built and checked ({SOURCE.name})")
