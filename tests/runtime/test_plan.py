"""The plan (``specdec.runtime.plan``): a torch-backend plan runs without the x86 package, its
knobs that need the x86 backend are errors naming them, the memory it takes and fits, and the
torch backend's forward in float64 against the x86 backend's and against transformers."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest
import torch
from transformers import LlamaConfig

from specdec.runtime import PlanError, Row, RuntimeConfig, resolve_plan
from specdec.runtime.weights import Shape
from tests.runtime import test_runtime
from tests.runtime.conftest import COMMON, TAPS, X86, forward_of, seq


def test_a_torch_backend_plan_never_imports_the_x86_package():
    """In a fresh interpreter: plan, load and run a pass on the torch backend; no module of
    ``specdec.runtime.x86`` is then loaded."""
    code = textwrap.dedent("""
        import sys
        import torch
        from transformers import AutoModelForCausalLM, LlamaConfig
        from specdec.runtime import Row, RuntimeConfig, load_forward, resolve_plan

        config = LlamaConfig(vocab_size=96, hidden_size=64, intermediate_size=96,
                             num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                             max_position_embeddings=128)
        plan = resolve_plan(RuntimeConfig(device="cpu", dtype="float64", backend="torch",
                                          max_model_len=64, slots=2), config)
        assert plan.backend == "torch", plan
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float64).eval()
        fwd = load_forward(model, plan)
        out = fwd([Row(fwd.pool.acquire(), [1, 2, 3], logits_at=[2])])[0]
        assert out.logits.shape == (1, 96) and bool(out.logits.isfinite().all())
        x86 = sorted(m for m in sys.modules if "specdec.runtime.x86" in m)
        print("x86 modules:", x86)
        assert not x86, x86
        print("ok")
    """)
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=300)
    assert run.returncode == 0 and run.stdout.strip().endswith("ok"), run.stdout + run.stderr


@pytest.mark.parametrize("knob,value", [("linears", "int8"), ("attention", "kernel"),
                                        ("kv_cache_dtype", "float16")])
def test_knobs_of_the_x86_backend_are_errors_naming_them_on_the_torch_one(knob, value):
    config = RuntimeConfig(device="cpu", dtype="float32", backend="torch", max_model_len=128,
                           **{knob: value})
    with pytest.raises(PlanError, match=f"{knob}: {value} needs the x86 backend") as e:
        resolve_plan(config, LlamaConfig(**COMMON))
    assert knob in str(e.value)


def per_token(model_config, plan) -> int:
    """One position of one slot, every layer: a key and a value per KV head."""
    s = Shape.from_config(model_config)
    return 2 * s.layers * s.kv_heads * s.head_dim * plan.kv_torch_dtype.itemsize


@pytest.mark.parametrize("knobs", [dict(backend="torch", dtype="float32"),
                                   dict(backend="torch", dtype="float64"),
                                   pytest.param(dict(backend="x86", dtype="float32"),
                                                marks=X86),
                                   pytest.param(dict(backend="x86", dtype="float32",
                                                     kv_cache_dtype="model"), marks=X86)])
def test_the_kv_pool_takes_a_key_and_a_value_per_layer_head_and_position(knobs):
    config = LlamaConfig(**COMMON)
    plan = resolve_plan(RuntimeConfig(device="cpu", slots=3, max_model_len=100, **knobs), config)
    s = Shape.from_config(config)
    assert plan.memory.kv_pool == (2 * s.layers * s.kv_heads * s.head_dim
                                   * plan.kv_torch_dtype.itemsize * 3 * 100)
    assert plan.memory.kv_per_token == per_token(config, plan)
    assert plan.memory.total == plan.memory.weights + plan.memory.kv_pool + plan.memory.workspace


def test_a_context_too_long_for_the_memory_is_an_error_and_auto_fits_it():
    """1 GiB: an explicit ``max_model_len`` whose KV pool does not fit names the fields to lower;
    ``max_model_len`` auto shrinks to the most whole 256-position blocks that fit."""
    config = LlamaConfig(**(COMMON | {"max_position_embeddings": 2 ** 20}))
    knobs = dict(device="cpu", dtype="float32", backend="torch", slots=8)
    with pytest.raises(PlanError, match="max_model_len") as e:
        resolve_plan(RuntimeConfig(max_model_len=2 ** 19, **knobs), config, memory="1GiB")
    assert "kv_slots" in str(e.value)
    plan = resolve_plan(RuntimeConfig(**knobs), config, memory="1GiB")
    m, n = plan.memory, plan.max_model_len
    assert 0 < n < 2 ** 20 and n % 256 == 0
    assert m.fits and m.device == 2 ** 30 and m.total <= 2 ** 30
    more = m.weights + m.workspace + 8 * (n + 256) * per_token(config, plan)
    assert more > 2 ** 30  # another block of positions would not fit
    assert any("max_model_len auto" in r for r in plan.reasons)
    fits = resolve_plan(RuntimeConfig(max_model_len=n, **knobs), config, memory="1GiB")
    assert fits.memory == m


def passes(fwd) -> list[torch.Tensor]:
    """A prefill, a decode, a k-token append, then a ragged batch with a tree and a prompt."""
    pool = fwd.pool
    a, b, c = pool.acquire(), pool.acquire(), pool.acquire()
    every = range(7)
    out = fwd([Row(a, seq(20, 1), logits_at=range(20), taps_at=range(20))])
    out += fwd([Row(a, seq(1, 2), logits_at=[0], taps_at=[0])])
    out += fwd([Row(a, seq(7, 3), logits_at=every, taps_at=every)])
    fwd([Row(b, seq(9, 4), logits_at=[8])])
    tree = torch.ones(3, 3, dtype=torch.bool).tril()
    tree[2, 1] = False
    out += fwd([Row(a, seq(2, 5), logits_at=range(2), taps_at=range(2)),
                Row(b, seq(3, 6), logits_at=range(3), taps_at=range(3), ancestors=tree),
                Row(c, seq(40, 7), logits_at=range(40), taps_at=range(40), chunk=True)])
    return [t for o in out for t in (o.logits, o.taps)]


@X86
def test_the_torch_backend_computes_what_the_x86_one_does_in_float64(hf):
    torch_fwd = forward_of(hf, TAPS, backend="torch", slots=3)
    x86_fwd = forward_of(hf, TAPS, backend="x86", slots=3)
    assert torch_fwd.backend.name == "torch" and x86_fwd.backend.name == "x86"
    for a, b in zip(passes(torch_fwd), passes(x86_fwd), strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-12)


CHECKS = [test_runtime.test_prefill_decode_and_append_equal_transformers,
          test_runtime.test_crop_then_append_equals_transformers,
          test_runtime.test_ragged_batch_equals_each_request_alone,
          test_runtime.test_mixed_batch_equals_each_request_alone,
          test_runtime.test_tree_masked_append_equals_each_branch_run_linearly]


@pytest.mark.parametrize("check", CHECKS, ids=[c.__name__[5:] for c in CHECKS])
def test_the_torch_backend_equals_transformers(hf, check, monkeypatch):
    """test_runtime's checks against transformers, each on a torch-backend plan's forward."""
    def make(model, slots: int = 4):
        fwd = forward_of(model, TAPS, backend="torch", slots=slots)
        assert fwd.backend.name == "torch"
        return fwd, fwd.pool

    monkeypatch.setattr(test_runtime, "make", make)
    check(hf)
