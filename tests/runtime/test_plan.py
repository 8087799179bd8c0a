"""The plan (``specdec.runtime.plan``): a torch-backend plan runs without the x86 package, its
knobs that need the x86 backend are errors naming them, the memory it takes and fits, and the
torch backend's forward in float64 against the x86 backend's and against transformers."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

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


def cgroup(root: Path, **files) -> Path:
    """A cgroup folder holding ``files`` (``cpu.max``; ``cpu/cpu.cfs_quota_us``, ...)."""
    for name, text in files.items():
        path = root / name.replace("__", "/")
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text + "\n")
    return root


@pytest.mark.parametrize("files,quota,cpus", [
    ({"cpu.max": "150000 100000"}, 1.5, 1),  # rounded down: threads beyond a quota stall
    ({"cpu.max": "300000 100000"}, 3.0, 3),
    ({"cpu.max": "50000 100000"}, 0.5, 1),  # at least one
    ({"cpu.max": "max 100000"}, None, 4),
    ({"cpu.max": "800000 100000"}, 8.0, 4),  # the affinity bounds it too
    ({"cpu__cpu.cfs_quota_us": "200000", "cpu__cpu.cfs_period_us": "100000"}, 2.0, 2),  # v1
    ({"cpu__cpu.cfs_quota_us": "-1", "cpu__cpu.cfs_period_us": "100000"}, None, 4),
    ({}, None, 4),
])
def test_threads_default_to_the_cpus_the_process_may_use_within_its_cgroup_quota(
        tmp_path, files, quota, cpus):
    from specdec.runtime.plan import cpu_quota, usable_cpus

    root = cgroup(tmp_path, **files)
    assert cpu_quota(root) == quota
    n, why = usable_cpus(affinity=4, cgroup=root)
    assert n == cpus and ("quota" in why) == (quota is not None and quota < 4)


def test_the_plan_resolves_threads_and_shows_them():
    from specdec.runtime.plan import usable_cpus

    knobs = dict(device="cpu", dtype="float64", backend="torch", max_model_len=64)
    plan = resolve_plan(RuntimeConfig(threads=3, **knobs), LlamaConfig(**COMMON), environ={})
    assert plan.threads == 3 and plan.to_dict()["threads"] == 3
    assert "3 torch threads, OpenMP wait policy default" in plan.describe()
    auto = resolve_plan(RuntimeConfig(**knobs), LlamaConfig(**COMMON), environ={})
    assert auto.threads == usable_cpus()[0]
    assert any(r.startswith(f"threads auto: {auto.threads}") for r in auto.reasons)
    for bad in (0, 1.5, True):
        with pytest.raises(PlanError, match="threads"):
            RuntimeConfig(threads=bad)


@pytest.mark.parametrize("asked,environ,policy,said", [
    ("auto", {}, "default", "omp_wait_policy auto: default"),
    ("active", {}, "active", None),
    ("passive", {}, "passive", None),
    ("auto", {"OMP_WAIT_POLICY": "ACTIVE"}, "active", "as the environment's OMP_WAIT_POLICY"),
    ("passive", {"OMP_WAIT_POLICY": "passive"}, "passive", "as the environment's"),
    ("auto", {"GOMP_SPINCOUNT": "1000"}, "default", "GOMP_SPINCOUNT=1000 in the environment"),
])
def test_the_wait_policy_is_the_environments_when_it_sets_one_else_auto_is_the_default(
        asked, environ, policy, said):
    from specdec.runtime.plan import omp_env

    config = RuntimeConfig(device="cpu", dtype="float64", backend="torch", max_model_len=64,
                           omp_wait_policy=asked)
    plan = resolve_plan(config, LlamaConfig(**COMMON), environ=environ)
    assert plan.omp_wait_policy == policy
    assert said is None or any(said in r for r in plan.reasons)
    # what a process of this plan starts with: the environment's own value, kept as it is
    value = environ.get("OMP_WAIT_POLICY") or policy.upper()
    assert omp_env(asked, environ) == ({} if value == "DEFAULT" else {"OMP_WAIT_POLICY": value})


def test_a_wait_policy_the_environment_contradicts_or_a_bad_one_is_an_error_naming_it():
    from specdec.runtime.plan import omp_env

    with pytest.raises(PlanError, match="omp_wait_policy must be one of"):
        RuntimeConfig(omp_wait_policy="spin")
    with pytest.raises(PlanError, match="omp_wait_policy: active, but the environment sets "
                                        "OMP_WAIT_POLICY=PASSIVE"):
        omp_env("active", {"OMP_WAIT_POLICY": "PASSIVE"})
    with pytest.raises(PlanError, match="OMP_WAIT_POLICY is 'spin'"):
        resolve_plan(RuntimeConfig(device="cpu", dtype="float64", backend="torch",
                                   max_model_len=64), LlamaConfig(**COMMON),
                     environ={"OMP_WAIT_POLICY": "spin"})
