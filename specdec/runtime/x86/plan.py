"""The x86 backend's part of the plan (``specdec.runtime.plan.resolve_plan``): which linears,
attention, KV dtype and dtype run on this CPU, given what its kernels need and whether they
build here. Every ``auto`` of the x86 backend is decided here; asked-for kinds that cannot run
are errors naming the knob and the reason.

``isa`` (the instruction set of specdec's kernels) decides which kernels may run: auto is
avx512 on a CPU with AVX-512 VNNI (every kernel), else avx2 with FMA and F16C (every kernel but
the float32 panel linear: the int8 linear, the attention and the fused ops, each the same
source on AVX2 vectors, bitwise the AVX-512 build's outputs), else none; ``isa: avx2`` plans as
on a CPU without AVX-512 (for tests and benchmarks on one with it).

How the other ``auto``s decide, by measurement (docs/RESULTS.md, "Runtime"):
- dtype: float32 where the model's GGUF codes run int8 rows (they beat bfloat16 on AMX too),
  else bfloat16 on a CPU with AMX (lossless by pieces, cheap rows), else float32;
- float32 linears: int8 rows on the codes (AVX-512 VNNI or AVX2), else the codes as float32
  panels, else float32 panels (AVX-512), else oneDNN's packed copy; bfloat16: oneDNN's; float64:
  torch's;
- attention: float32, specdec's kernel where it builds; where it does not and the linears are
  batch invariant, grouped or per-query SDPA as in bfloat16, so the passes stay batch
  invariant; bfloat16, grouped where its invariance probe passes, else per query; float64,
  SDPA;
- KV caches: float16 for float32 passes on the kernel (it reads them exactly), else the model's.
"""

from __future__ import annotations

from collections.abc import Callable

from specdec.runtime.plan import PlanError, RuntimeConfig, cpu_flags
from specdec.runtime.weights import Shape
from specdec.runtime.x86 import attend, fused, int8, kernels, panels

KERNEL_LINEARS = {"int8": int8, "quantized": panels, "panels": panels}
INVARIANT_ATTENTIONS = ("kernel", "grouped", "per_query")  # each query's result its own alone
INT8_BUILDS = {"avx512": "AVX-512 VNNI", "avx2": "AVX2"}  # the int8 kernel's, as the plan says


def resolve_kinds(config: RuntimeConfig, shape: Shape, blocks: bool, reasons: list) -> dict:
    isa = pick_isa(config, reasons)
    dtype = pick_dtype(config, isa, blocks, reasons)
    if dtype == "bfloat16":
        return invariant_kinds(config, shape, reasons) | {"isa": isa}
    linears = pick_linears(config, isa, dtype, blocks, reasons)
    attention = pick_attention(config, isa, dtype, shape, linears, reasons)
    kv = pick_kv(config, dtype, attention, reasons)
    invariant = linears in KERNEL_LINEARS and attention in INVARIANT_ATTENTIONS
    numerics = dtype
    if linears == "int8":
        numerics = (f"int8 rows on the GGUF's codes (llama.cpp's numerics, not float32's; "
                    f"the {INT8_BUILDS[isa]} kernel)")
    if kv == "float16" and dtype != "float16":
        numerics += "; keys and values rounded to float16 in the KV caches"
    # specdec's kernels give each output to one thread, in a fixed order; invariant attention
    # runs on one thread: a pass's bits then do not depend on its threads
    return dict(dtype=dtype, numerics=numerics, linears=linears, attention=attention,
                kv_cache_dtype=kv, batch_invariant=invariant, isa=isa, thread_invariant=invariant,
                fused=dtype == "float32" and kernel_off(isa, fused.unavailable) is None)


def lacking(isa: str, needs: tuple[str, ...] = ()) -> list[str]:
    """The CPU features the kernels built for ``isa`` (and ``needs``) need that this CPU lacks."""
    return [f for f in (*kernels.ISAS[isa], *needs) if f not in cpu_flags()]


def pick_isa(config: RuntimeConfig, reasons: list) -> str:
    """avx512 | avx2 | none: the instruction set specdec's kernels run on."""
    if config.isa != "auto":
        missing = lacking(config.isa)
        if missing:
            raise PlanError(f"isa: {config.isa} cannot run here: the CPU has no "
                            f"{' / '.join(missing)} (isa: auto)")
        return config.isa
    if not lacking("avx512", int8.NEEDS["avx512"]):
        return "avx512"
    if not lacking("avx2"):
        reasons.append("isa auto: avx2 (no AVX-512 VNNI here): every kernel's AVX2 build, and "
                       "no float32 panels")
        return "avx2"
    reasons.append("isa auto: none (no AVX2 with FMA and F16C here): none of specdec's kernels")
    return "none"


def avx512_off(isa: str, why: str | None) -> str | None:
    """Why an AVX-512 kernel (``why``: its own reason, or None) does not run with ``isa``."""
    return why if isa == "avx512" else f"isa {isa} runs no AVX-512 kernel"


def kernel_off(isa: str, unavailable: Callable[[str], str | None]) -> str | None:
    """Why a kernel built for every ISA (the int8 linear, the attention, the fused ops: its
    ``unavailable``) does not run with ``isa``, or None where it does."""
    return unavailable(isa) if isa in kernels.ISAS else "no AVX2 or AVX-512 here"


def int8_runs(config: RuntimeConfig, isa: str, blocks: bool) -> bool:
    return blocks and config.linears in ("auto", "int8") and kernel_off(isa, int8.unavailable) is None


def float32_only(config: RuntimeConfig) -> str | None:
    """The knob asked for that only float32 passes run, if any."""
    for knob, values in (("linears", ("torch", "panels", "quantized", "int8")),
                         ("attention", ("kernel", "sdpa")), ("kv_cache_dtype", ("float16",))):
        if getattr(config, knob) in values:
            return f"{knob}: {getattr(config, knob)}"
    return None


def pick_dtype(config: RuntimeConfig, isa: str, blocks: bool, reasons: list) -> str:
    if config.dtype != "auto":
        return config.dtype
    knob = float32_only(config)
    if knob:
        reasons.append(f"dtype auto: float32, which {knob} runs")
        return "float32"
    if int8_runs(config, isa, blocks):
        reasons.append("dtype auto: float32, whose linears run int8 rows on the GGUF's codes")
        return "float32"
    if "amx_bf16" in cpu_flags():
        reasons.append("dtype auto: bfloat16 on a CPU with AMX")
        return "bfloat16"
    reasons.append("dtype auto: float32")
    return "float32"


def pick_linears(config: RuntimeConfig, isa: str, dtype: str, blocks: bool,
                 reasons: list) -> str:
    asked = config.linears
    panels_off = avx512_off(isa, panels.unavailable())
    if asked in KERNEL_LINEARS:
        why = kernel_off(isa, int8.unavailable) if asked == "int8" else panels_off
        if dtype != "float32":
            raise PlanError(f"linears: {asked} runs float32 passes, not {dtype} (dtype: float32)")
        if why:
            raise PlanError(f"linears: {asked} cannot run here: {why}")
        if asked in ("int8", "quantized") and not blocks:
            raise PlanError(f"linears: {asked} needs the model's GGUF blocks (a named source "
                            f"keeps them), and this model has none")
        return asked
    if asked != "auto":
        return asked
    if dtype != "float32":
        return "torch" if dtype == "float64" else "onednn"
    if int8_runs(config, isa, blocks):
        chosen = "int8"
    elif panels_off is None:
        chosen = "quantized" if blocks else "panels"
    else:
        chosen = "onednn"
        reasons.append(f"linears auto: onednn ({panels_off})")
    return chosen


def pick_attention(config: RuntimeConfig, isa: str, dtype: str, shape: Shape, linears: str,
                   reasons: list) -> str:
    """float32 passes: the kernel where it runs; where it does not and the linears are batch
    invariant, invariant SDPA (``invariant_attention``), so the passes stay invariant."""
    asked = config.attention
    if asked in ("grouped", "per_query") and dtype != "float32":
        raise PlanError(f"attention: {asked} is for batch-invariant float32 or bfloat16 passes; "
                        f"these are {dtype} (attention: auto or sdpa)")
    kernel_why = kernel_off(isa, lambda i: attend.unavailable(shape.head_dim, i)) \
        if dtype == "float32" else f"it runs float32 passes, not {dtype}"
    if asked == "kernel" and kernel_why:
        raise PlanError(f"attention: kernel cannot run here: {kernel_why}")
    if asked != "auto":
        return asked
    if not kernel_why:
        return "kernel"
    if dtype == "float32" and linears in KERNEL_LINEARS:
        attention = invariant_attention(shape, "float32")
        reasons.append(f"attention auto: {attention}, batch invariant ({kernel_why}; the "
                       f"grouped invariance probe {'passed' if attention == 'grouped' else 'failed'}"
                       f" here)")
        return attention
    if dtype == "float32":
        reasons.append(f"attention auto: sdpa ({kernel_why})")
    return "sdpa"


def invariant_attention(shape: Shape, dtype: str) -> str:
    """grouped where its invariance probe passes on this machine, else per_query."""
    import torch

    from specdec.runtime.x86.invariance import attention_invariant

    grouped = attention_invariant("grouped", shape.heads, shape.kv_heads, shape.head_dim,
                                  getattr(torch, dtype))
    return "grouped" if grouped else "per_query"


def pick_kv(config: RuntimeConfig, dtype: str, attention: str, reasons: list) -> str:
    exact = dtype == "float32" and attention == "kernel"  # the kernel reads float16 exactly
    if config.kv_cache_dtype == "float16" and not exact:
        raise PlanError(f"kv_cache_dtype: float16 needs float32 passes on the attention kernel; "
                        f"these are {dtype} on {attention} (kv_cache_dtype: auto or model)")
    if config.kv_cache_dtype == "float16" or config.kv_cache_dtype == "auto" and exact:
        return "float16"
    return dtype


def invariant_kinds(config: RuntimeConfig, shape: Shape, reasons: list) -> dict:
    """bfloat16: batch invariant by pieces, on oneDNN's linears and SDPA's grouped or
    per-query attention (``invariance``)."""
    if config.linears not in ("auto", "onednn"):
        raise PlanError(f"linears: {config.linears} does not run bfloat16 passes "
                        f"(linears: auto or onednn)")
    if config.attention in ("kernel", "sdpa"):
        raise PlanError(f"attention: {config.attention} is for passes that are not batch "
                        f"invariant; bfloat16 ones attend grouped or per_query (or auto)")
    if config.kv_cache_dtype == "float16":
        raise PlanError("kv_cache_dtype: float16 needs float32 passes on the attention kernel "
                        "(kv_cache_dtype: auto or model)")
    attention = config.attention
    if attention == "auto":
        attention = invariant_attention(shape, "bfloat16")
        reasons.append(f"attention auto: {attention} (the grouped invariance probe "
                       f"{'passed' if attention == 'grouped' else 'failed'} here)")
    return dict(dtype="bfloat16", numerics="bfloat16", linears="onednn", attention=attention,
                kv_cache_dtype="bfloat16", batch_invariant=True, fused=False)
