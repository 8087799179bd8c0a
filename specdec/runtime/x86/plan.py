"""The x86 backend's part of the plan (``specdec.runtime.plan.resolve_plan``): which linears,
attention, KV dtype and dtype run on this CPU, given what its kernels need and whether they
build here. Every ``auto`` of the x86 backend is decided here; asked-for kinds that cannot run
are errors naming the knob and the reason.

How ``auto`` decides, by measurement (docs/RESULTS.md, "Runtime"):
- dtype: float32 where the model's GGUF codes run int8 rows (they beat bfloat16 on AMX too),
  else bfloat16 on a CPU with AMX (lossless by pieces, cheap rows), else float32;
- float32 linears: int8 rows on the codes (AVX-512 VNNI), else the codes as float32 panels,
  else float32 panels (AVX-512), else oneDNN's packed copy; bfloat16: oneDNN's; float64: torch's;
- attention: float32, specdec's kernel where it builds; bfloat16, grouped where its invariance
  probe passes, else per query; float64, SDPA;
- KV caches: float16 for float32 passes on the kernel (it reads them exactly), else the model's.
"""

from __future__ import annotations

from specdec.runtime.plan import PlanError, RuntimeConfig, cpu_flags
from specdec.runtime.weights import Shape
from specdec.runtime.x86 import attend, fused, int8, panels

KERNEL_LINEARS = {"int8": int8, "quantized": panels, "panels": panels}


def resolve_kinds(config: RuntimeConfig, shape: Shape, blocks: bool, reasons: list) -> dict:
    dtype = pick_dtype(config, blocks, reasons)
    if dtype == "bfloat16":
        return invariant_kinds(config, shape, reasons)
    linears = pick_linears(config, dtype, blocks, reasons)
    attention = pick_attention(config, dtype, shape, reasons)
    kv = pick_kv(config, dtype, attention, reasons)
    invariant = linears in KERNEL_LINEARS and attention == "kernel"
    numerics = dtype
    if linears == "int8":
        numerics = "int8 rows on the GGUF's codes (llama.cpp's numerics, not float32's)"
    if kv == "float16" and dtype != "float16":
        numerics += "; keys and values rounded to float16 in the KV caches"
    return dict(dtype=dtype, numerics=numerics, linears=linears, attention=attention,
                kv_cache_dtype=kv, batch_invariant=invariant,
                fused=dtype == "float32" and fused.unavailable() is None)


def int8_runs(config: RuntimeConfig, blocks: bool) -> bool:
    return blocks and config.linears in ("auto", "int8") and int8.unavailable() is None


def float32_only(config: RuntimeConfig) -> str | None:
    """The knob asked for that only float32 passes run, if any."""
    for knob, values in (("linears", ("torch", "panels", "quantized", "int8")),
                         ("attention", ("kernel", "sdpa")), ("kv_cache_dtype", ("float16",))):
        if getattr(config, knob) in values:
            return f"{knob}: {getattr(config, knob)}"
    return None


def pick_dtype(config: RuntimeConfig, blocks: bool, reasons: list) -> str:
    if config.dtype != "auto":
        return config.dtype
    knob = float32_only(config)
    if knob:
        reasons.append(f"dtype auto: float32, which {knob} runs")
        return "float32"
    if int8_runs(config, blocks):
        reasons.append("dtype auto: float32, whose linears run int8 rows on the GGUF's codes")
        return "float32"
    if "amx_bf16" in cpu_flags():
        reasons.append("dtype auto: bfloat16 on a CPU with AMX")
        return "bfloat16"
    reasons.append("dtype auto: float32")
    return "float32"


def pick_linears(config: RuntimeConfig, dtype: str, blocks: bool, reasons: list) -> str:
    asked = config.linears
    if asked in KERNEL_LINEARS:
        why = KERNEL_LINEARS[asked].unavailable()
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
    if int8_runs(config, blocks):
        chosen = "int8"
    elif panels.unavailable() is None:
        chosen = "quantized" if blocks else "panels"
    else:
        chosen = "onednn"
        reasons.append(f"linears auto: onednn ({panels.unavailable()})")
    return chosen


def pick_attention(config: RuntimeConfig, dtype: str, shape: Shape, reasons: list) -> str:
    asked = config.attention
    if asked in ("grouped", "per_query"):
        raise PlanError(f"attention: {asked} is for batch-invariant bfloat16 passes; these are "
                        f"{dtype} (attention: auto, kernel or sdpa)")
    kernel_why = attend.unavailable(shape.head_dim) if dtype == "float32" else \
        f"it runs float32 passes, not {dtype}"
    if asked == "kernel" and kernel_why:
        raise PlanError(f"attention: kernel cannot run here: {kernel_why}")
    if asked == "auto":
        if kernel_why and dtype == "float32":
            reasons.append(f"attention auto: sdpa ({kernel_why})")
        return "sdpa" if kernel_why else "kernel"
    return asked


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
    from specdec.runtime.x86.invariance import attention_invariant

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
        import torch
        grouped = attention_invariant("grouped", shape.heads, shape.kv_heads, shape.head_dim,
                                      torch.bfloat16)
        attention = "grouped" if grouped else "per_query"
        reasons.append(f"attention auto: {attention} (the grouped invariance probe "
                       f"{'passed' if grouped else 'failed'} here)")
    return dict(dtype="bfloat16", numerics="bfloat16", linears="onednn", attention=attention,
                kv_cache_dtype="bfloat16", batch_invariant=True, fused=False)
