"""How the x86 plan decides ``dtype: auto`` (``specdec.runtime.x86.plan``), on any CPU: the CPU's
flags and which kernels run are set here, so every branch runs on every machine."""

from __future__ import annotations

import pytest

from specdec.models.tiny import tiny_config
from specdec.runtime import plan as plans
from specdec.runtime.plan import PlanError, RuntimeConfig, resolve_plan
from specdec.runtime.x86 import attend, fused, int8, panels
from specdec.runtime.x86 import plan as x86_plan

pytestmark = pytest.mark.skipif(not plans.x86_cpu(), reason="the x86 backend runs x86-64 CPUs")


AVX512 = {"avx512f", "avx512bw", "avx512_vnni", "avx2", "fma", "f16c"}


@pytest.fixture
def cpu(monkeypatch):
    """cpu(amx=..., vnni=...): this CPU as an AVX-512 one with (or without) AMX and the int8
    kernel (either build), its other kernels built (whatever this machine's CPU)."""
    def set_cpu(amx: bool, vnni: bool):
        flags = AVX512 | {"amx_bf16"} if amx else AVX512
        monkeypatch.setattr(x86_plan, "cpu_flags", lambda: frozenset(flags))
        monkeypatch.setattr(int8, "unavailable", lambda isa="avx512": None if vnni else "no VNNI")
        for kernel in (attend, fused, panels):
            monkeypatch.setattr(kernel, "unavailable", lambda *args: None)
    return set_cpu


def auto(blocks: bool, linears: str = "auto", device: str = "cpu") -> str:
    config = RuntimeConfig(device, "auto", linears=linears, max_model_len=64)
    return resolve_plan(config, tiny_config(), blocks).dtype


@pytest.mark.parametrize("amx", [True, False])
def test_bfloat16_only_on_a_cpu_with_amx(cpu, amx):
    cpu(amx, vnni=False)
    assert auto(blocks=False) == ("bfloat16" if amx else "float32")
    assert auto(blocks=False, device="meta") == "float32"  # the torch backend


@pytest.mark.parametrize("amx", [True, False])
def test_float32_for_a_model_on_int8_rows(cpu, amx):
    """A model whose linears run int8 rows on its GGUF codes is served in float32, AMX or not;
    without the int8 kernel, or with other linears asked for, AMX's bfloat16 again."""
    cpu(amx, vnni=True)
    assert auto(blocks=True) == "float32"
    cpu(amx, vnni=False)
    assert auto(blocks=True) == ("bfloat16" if amx else "float32")


@pytest.mark.parametrize("knob", [{"linears": "panels"}, {"attention": "kernel"},
                                  {"kv_cache_dtype": "float16"}, {"linears": "torch"}])
def test_a_float32_knob_makes_auto_float32_on_amx(cpu, knob):
    """Asking for what only float32 passes run decides dtype auto, AMX or not (the plan says
    why); auto knobs leave it to the CPU."""
    cpu(amx=True, vnni=False)
    plan = resolve_plan(RuntimeConfig("cpu", "auto", max_model_len=64, **knob), tiny_config())
    assert plan.dtype == "float32" and any("float32, which" in r for r in plan.reasons)


AVX2 = {"avx2", "fma", "f16c"}


def plan_on(monkeypatch, flags: set, blocks: bool = True, **knobs):
    """The tiny model's x86 plan on a CPU with ``flags``, every kernel available (the plan
    turns off those its ISA does not run)."""
    monkeypatch.setattr(x86_plan, "cpu_flags", lambda: frozenset(flags))
    monkeypatch.setattr(int8, "unavailable", lambda isa="avx512": None)
    for kernel in (attend, fused, panels):
        monkeypatch.setattr(kernel, "unavailable", lambda *args: None)
    config = RuntimeConfig("cpu", "auto", backend="x86", max_model_len=64, **knobs)
    return resolve_plan(config, tiny_config(), blocks)


def test_a_cpu_without_avx512_runs_every_kernel_but_the_panels_on_avx2(monkeypatch):
    """AVX2 with FMA and F16C, no AVX-512: the default linears are int8 rows on the AVX2 build,
    in float32, with the attention kernel (float16 KV caches) and the fused steps on their AVX2
    builds, batch invariant; the plan says which kernel runs. Without codes the linears are
    oneDNN's (the float32 panels are AVX-512 code)."""
    plan = plan_on(monkeypatch, AVX2)
    assert (plan.isa, plan.dtype, plan.linears) == ("avx2", "float32", "int8")
    assert plan.attention == "kernel" and plan.kv_cache_dtype == "float16"
    assert plan.batch_invariant and plan.fused
    assert "AVX2 kernel" in plan.numerics and "(avx2 kernels)" in plan.describe()
    assert any(r.startswith("isa auto: avx2") for r in plan.reasons)
    plain = plan_on(monkeypatch, AVX2, blocks=False)
    assert (plain.linears, plain.attention, plain.batch_invariant) == ("onednn", "kernel", False)


def test_avx512_without_vnni_is_an_avx2_cpu_to_auto(monkeypatch):
    assert plan_on(monkeypatch, AVX2 | {"avx512f", "avx512bw"}).isa == "avx2"


def test_isa_avx2_runs_the_avx2_path_on_an_avx512_cpu_and_auto_keeps_avx512(monkeypatch):
    """On an AVX-512 VNNI CPU auto stays AVX-512 (its kernels, int8 on VNNI); ``isa: avx2``
    plans as on a CPU without AVX-512."""
    default = plan_on(monkeypatch, AVX512)
    assert (default.isa, default.linears, default.attention) == ("avx512", "int8", "kernel")
    assert "AVX-512 VNNI kernel" in default.numerics and default.fused
    forced = plan_on(monkeypatch, AVX512, isa="avx2")
    assert (forced.isa, forced.linears, forced.attention) == ("avx2", "int8", "kernel")
    assert forced.fused and forced.batch_invariant
    with pytest.raises(PlanError, match="linears: panels cannot run here: isa avx2"):
        plan_on(monkeypatch, AVX512, isa="avx2", linears="panels")


def test_a_bad_or_impossible_isa_is_an_error_naming_it(monkeypatch):
    with pytest.raises(PlanError, match=r"isa must be one of \['auto', 'avx512', 'avx2'\]"):
        RuntimeConfig(isa="sse4")
    with pytest.raises(PlanError, match="isa: avx512 cannot run here: the CPU has no avx512f"):
        plan_on(monkeypatch, AVX2, isa="avx512")
    with pytest.raises(PlanError, match="isa: avx2 needs the x86 backend"):
        resolve_plan(RuntimeConfig("meta", isa="avx2", max_model_len=64), tiny_config())
