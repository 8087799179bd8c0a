"""Building specdec's C++ kernels for x86 CPUs: the float32 panel linear (``panels``), the
linear on GGUF codes and int8 rows (``int8``, with AVX-512 VNNI, or AVX2), the float32 attention
of short rows (``attend``) and the fused float32 element-wise ops (``fused``).

Each is built for an instruction set (``ISAS``): ``avx512`` (every kernel), or ``avx2`` (with FMA
and F16C: every kernel but the panel linear, each from the same source on ``lanes.h``). A build
for another ISA than AVX-512 is an extension of its own name (``specdec_int8_avx2``), so both
load in one process.

Each is compiled on first use with the machine's C++ compiler, through
``torch.utils.cpp_extension``, into torch's extension cache (about 25 s each on 2 cores);
``make setup`` builds them all, each for every ISA the CPU runs (``make kernels``: ``main``
below), so serving starts warm. Where one cannot be had (another CPU, no compiler, a failed
build) ``build`` returns the reason, and the plan says so and runs torch's own ops.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import logging
import os
import platform
import shutil
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch

from specdec.runtime.plan import cpu_flags, x86_cpu

log = logging.getLogger(__name__)
STALE_LOCK_S = 600  # a build takes about 25 s; a lock this old was left by a killed build

# OpenMP: at::parallel_for's threads, which resolve to the libgomp torch already loaded, so
# torch.set_num_threads bounds them. No contraction of a product and a sum into one fused
# multiply-add unless the source asks for one: g++ contracts vector intrinsics too, and RoPE
# must round as the eager ops do
FLAGS = ["-O3", "-fopenmp", "-ffp-contract=off"]
# the CPU features (cpuinfo's names) a kernel built for each ISA is compiled for and needs
ISAS = {"avx512": ("avx512f", "fma"), "avx2": ("avx2", "fma", "f16c")}


def gcc_flag(feature: str) -> str:
    """gcc's flag for a CPU feature by cpuinfo's name (``avx512_vnni``: ``-mavx512vnni``,
    ``amx_int8``: ``-mamx-int8``)."""
    return "-m" + feature.replace("_", "-" if feature.startswith("amx") else "")


def missing(isa: str, needs: tuple[str, ...] = ()) -> list[str]:
    """The CPU features a kernel built for ``isa`` (needing ``needs`` too) lacks here."""
    return [f for f in (*ISAS[isa], *needs) if f not in cpu_flags()]


@functools.cache
def build(source: Path, needs: tuple[str, ...] = (), may_use: tuple[str, ...] = (),
          isa: str = "avx512"):
    """The extension compiled from ``source`` for ``isa`` (named ``specdec_<stem>``, or
    ``specdec_<stem>_<isa>`` for another ISA than avx512), or the reason it cannot be had here
    (a str). ``needs``: CPU features beyond the ISA's it is compiled for (cpuinfo's names:
    ``avx512_vnni`` is gcc's ``-mavx512vnni``); ``may_use``: features it is compiled for too
    but checks for itself at run time (``amx_int8``)."""
    if isa not in ISAS:
        raise ValueError(f"specdec's kernels are built for {list(ISAS)}, not {isa!r}")
    if not x86_cpu():
        return f"the CPU is {platform.machine()}, not x86-64"
    lacking = missing(isa, needs)
    if lacking:
        return f"the CPU has no {' / '.join(lacking)}"
    try:
        from torch.utils.cpp_extension import load
        stem = source.stem if isa == "avx512" else f"{source.stem}_{isa}"
        name = f"specdec_{stem}"
        directory = build_directory(source, stem)
        clear_stale_lock(directory)
        with own_ninja():
            isa_flags = [gcc_flag(f) for f in ISAS[isa]]
            flags = FLAGS[:1] + isa_flags + FLAGS[1:] + [gcc_flag(f) for f in (*needs, *may_use)]
            return load(name, [str(source)], extra_cflags=flags, extra_ldflags=["-fopenmp"],
                        build_directory=str(directory), verbose=False)
    except Exception as e:  # no compiler, a failed build: the caller says so and goes on
        return f"building {source.name} failed: {type(e).__name__}: {e}"


@contextlib.contextmanager
def own_ninja():
    """Build with the ninja beside this Python (the venv's) where there is one, whatever the
    PATH: two ninjas (a venv's and the system's) may hash a build's command differently, so a
    shell with the venv activated and ``make``'s bare ``.venv/bin/python`` would each rebuild
    what the other had built."""
    here = str(Path(sys.executable).parent)
    path = os.environ.get("PATH", "")
    if not shutil.which("ninja", path=here):
        yield
        return
    os.environ["PATH"] = here + os.pathsep + path
    try:
        yield
    finally:
        os.environ["PATH"] = path


def build_directory(source: Path, stem: str | None = None) -> Path:
    """Where the kernel of ``source`` is built (``stem``: its build's name, the source's stem by
    default): under torch's extension cache (``$TORCH_EXTENSIONS_DIR``), in a folder of this
    checkout's own, so two checkouts of specdec on one machine do not rebuild each other's
    kernels on every load."""
    root = os.environ.get("TORCH_EXTENSIONS_DIR") or Path.home() / ".cache" / "torch_extensions"
    checkout = hashlib.sha256(str(source.resolve().parent).encode()).hexdigest()[:10]
    directory = Path(root) / f"specdec-{checkout}" / (stem or source.stem)
    directory.mkdir(parents=True, exist_ok=True)
    return directory


def clear_stale_lock(directory: Path) -> None:
    """Remove a build lock older than any build: torch waits on that file for as long as it
    exists, so a build killed midway (a Ctrl-C, a timeout) would leave every later load of the
    kernel hanging, without a word."""
    lock = directory / "lock"
    try:
        age = time.time() - lock.stat().st_mtime
    except FileNotFoundError:
        return
    if age > STALE_LOCK_S:
        log.warning("removing the stale build lock %s (%.0f s old)", lock, age)
        lock.unlink(missing_ok=True)


def built_isas(what: str, unavailable: Callable[[str], str | None]) -> list[str]:
    """The ISAs whose build of ``what`` (its ``unavailable(isa)``) runs here; says which do
    not, and why (the kernels' ``main``s)."""
    isas = []
    for isa in ISAS:
        reason = unavailable(isa)
        if reason:
            print(f"specdec {what} ({isa}): not built ({reason})")
        else:
            isas.append(isa)
    return isas


def unavailable(source: Path, isa: str = "avx512") -> str | None:
    """Why the kernel of ``source`` built for ``isa`` cannot run here, or None when it can."""
    built = build(source, isa=isa)
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
    from specdec.runtime.x86 import attend, fused, int8, panels
    panels.main()
    int8.main()
    attend.main()
    fused.main()
