"""How the x86 plan decides ``dtype: auto`` (``specdec.runtime.x86.plan``), on any CPU: the CPU's
flags and which kernels run are set here, so every branch runs on every machine."""

from __future__ import annotations

import pytest

from specdec.models.tiny import tiny_config
from specdec.runtime import plan as plans
from specdec.runtime.plan import RuntimeConfig, resolve_plan
from specdec.runtime.x86 import int8
from specdec.runtime.x86 import plan as x86_plan

pytestmark = pytest.mark.skipif(not plans.x86_cpu(), reason="the x86 backend runs x86-64 CPUs")


@pytest.fixture
def cpu(monkeypatch):
    """cpu(amx=..., vnni=...): this CPU as one with (or without) AMX and the int8 kernel."""
    def set_cpu(amx: bool, vnni: bool):
        flags = {"avx512f", "amx_bf16"} if amx else {"avx512f"}
        monkeypatch.setattr(x86_plan, "cpu_flags", lambda: frozenset(flags))
        monkeypatch.setattr(int8, "unavailable", lambda: None if vnni else "no VNNI")
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
