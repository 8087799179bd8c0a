"""Building specdec's C++ kernels for x86 CPUs with AVX-512: the float32 panel linear
(``panels``), the float32 attention of short rows (``attend``) and the fused float32
element-wise ops (``fused``).

Each is compiled on first use with the machine's C++ compiler, through
``torch.utils.cpp_extension``, into torch's extension cache (about 25 s each on 2 cores);
``make setup`` builds both (``make kernels``: ``main`` below), so serving starts warm. Where one
cannot be had (another CPU, no compiler, a failed build) ``build`` returns the reason, and the
runtime says so once and runs torch's own kernels.
"""

from __future__ import annotations

import functools
import logging
import platform
from pathlib import Path

import torch

log = logging.getLogger(__name__)

# OpenMP: at::parallel_for's threads, which resolve to the libgomp torch already loaded, so
# torch.set_num_threads bounds them. No contraction of a product and a sum into one fused
# multiply-add unless the source asks for one: g++ contracts vector intrinsics too, and RoPE
# must round as the eager ops do
FLAGS = ["-O3", "-mavx512f", "-mfma", "-fopenmp", "-ffp-contract=off"]


def cpu_flags() -> set[str]:
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return set()
    line = next((line for line in text.splitlines() if line.startswith("flags")), "")
    return set(line.partition(":")[2].split())


@functools.cache
def build(source: Path):
    """The extension compiled from ``source`` (named ``specdec_<stem>``), or the reason it
    cannot be had here (a str)."""
    if platform.machine() not in ("x86_64", "AMD64"):
        return f"the CPU is {platform.machine()}, not x86-64"
    if "avx512f" not in cpu_flags():
        return "the CPU has no AVX-512"
    try:
        from torch.utils.cpp_extension import load
        return load(f"specdec_{source.stem}", [str(source)], extra_cflags=FLAGS,
                    extra_ldflags=["-fopenmp"], verbose=False)
    except Exception as e:  # no compiler, a failed build: the caller says so and goes on
        return f"building {source.name} failed: {type(e).__name__}: {e}"


def unavailable(source: Path) -> str | None:
    """Why the kernel of ``source`` cannot run here, or None when it can."""
    built = build(source)
    return built if isinstance(built, str) else None


def usable(source: Path, dtype: torch.dtype, device: torch.device, what: str,
           instead: str) -> bool:
    """Whether float32 on a CPU runs ``what`` (the kernel of ``source``) here; logs once why
    not, and what it runs ``instead``."""
    if dtype != torch.float32 or device.type != "cpu":
        return False
    reason = unavailable(source)
    if reason:
        _warn(what, reason, instead)
    return reason is None


@functools.cache
def _warn(what: str, reason: str, instead: str) -> None:
    log.warning("specdec's %s is off (%s); float32 runs %s", what, reason, instead)


def main() -> None:
    """Build and check every kernel now (``make kernels``), so the first model load does not
    wait for a build."""
    from specdec.runtime import attend, fused, panels
    panels.main()
    attend.main()
    fused.main()
