"""The fused float32 element-wise ops (specdec/runtime/x86/fused.cpp), each ISA's build, against
torch's: the RMSNorm and silu * up within float32 rounding of float64, RoPE and the KV write
bitwise the eager ops' (``backend.rope``, ``KVPool.write``), every row bitwise its result alone,
the AVX2 build bitwise the AVX-512 build, bad input refused with the reason; and a float32
forward on them against transformers."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from transformers import AutoModelForCausalLM, LlamaConfig

from specdec.runtime import Row
from specdec.runtime.backend import rope
from specdec.runtime.x86 import fused, kernels
from tests.runtime.conftest import both_builds, first_isa, forward_of, per_isa

ISAS = per_isa(fused.unavailable)
ISA = first_isa(fused.unavailable)
pytestmark = pytest.mark.skipif(ISA is None, reason=f"fused ops: {fused.unavailable('avx2')}")


def randn(*shape, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("H", [8, 64, 576, 1000])
def test_the_rms_norm_is_float64s_within_rounding_and_each_row_its_own(H, isa):
    x, w = randn(40, H) * 3, randn(H, seed=1)
    x64 = x.double()
    want = w.double() * (x64 * torch.rsqrt(x64.pow(2).mean(-1, keepdim=True) + 1e-6))
    got = fused.rms_norm(x, w, 1e-6, isa)
    torch.testing.assert_close(got.double(), want, rtol=1e-6, atol=1e-6)
    alone = torch.cat([fused.rms_norm(x[i:i + 1], w, 1e-6, isa) for i in range(40)])
    assert torch.equal(got, alone)
    wide = torch.zeros(40, H + 5)
    wide[:, :H] = x
    assert torch.equal(fused.rms_norm(wide[:, :H], w, 1e-6, isa), got)  # strided rows


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("inner", [16, 100, 1536])
def test_silu_mul_is_float64s_within_rounding_and_each_row_its_own(inner, isa):
    g = randn(24, 2 * inner) * 4
    g[0, :3] = torch.tensor([-200.0, 100.0, 0.0])  # far tails: 0, itself, 0
    want = F.silu(g[:, :inner].double()) * g[:, inner:].double()
    got = fused.silu_mul(g, isa)
    torch.testing.assert_close(got.double(), want, rtol=1e-6, atol=1e-6)
    assert torch.equal(got, torch.cat([fused.silu_mul(g[i:i + 1], isa) for i in range(24)]))


@both_builds(fused.unavailable)
def test_the_avx2_build_is_bitwise_the_avx512_builds():
    """Every lane the same IEEE operation, every sum the same tree (``lanes.h``): the norm, silu
    over its whole range (e^-x from past float32's least subnormal to past its largest finite
    value) and RoPE's writes to float32 and float16 caches, the same to the bit."""
    x, w = randn(37, 1000) * 5, randn(1000, seed=1)
    assert torch.equal(*(fused.rms_norm(x, w, 1e-6, isa) for isa in kernels.ISAS))
    sweep = torch.linspace(-120, 100, 37 * 1536).reshape(37, 1536)
    g = torch.cat([sweep, randn(37, 1536, seed=2)], dim=1)
    assert torch.equal(*(fused.silu_mul(g, isa) for isa in kernels.ISAS))
    heads, kvh, d, N = 6, 2, 64, 7
    qkv, cos, sin = randn(N, (heads + 2 * kvh) * d) * 300, randn(N, d, seed=2), randn(N, d, seed=3)
    slots, positions = torch.tensor([0, 0, 2, 2, 2, 1, 0]), torch.tensor([5, 6, 0, 1, 2, 9, 7])
    for dtype in (torch.float32, torch.float16):
        outs = []
        for isa in kernels.ISAS:
            k, v = (torch.zeros(3, kvh, 16, d, dtype=dtype) for _ in "kv")
            outs.append((fused.rope_write(qkv, cos, sin, k, v, slots, positions, heads, isa), k, v))
        assert all(torch.equal(a, b) for a, b in zip(*outs, strict=True))


@pytest.mark.parametrize("isa", ISAS)
def test_rope_and_the_kv_write_are_bitwise_the_eager_ones(isa):
    heads, kvh, d, N = 6, 2, 64, 7
    qkv = randn(N, (heads + 2 * kvh) * d)
    cos, sin = randn(N, 1, d, seed=2), randn(N, 1, d, seed=3)
    slots = torch.tensor([0, 0, 2, 2, 2, 1, 0])
    positions = torch.tensor([5, 6, 0, 1, 2, 9, 7])
    caches = [torch.zeros(3, kvh, 16, d) for _ in range(4)]  # fused k, v; eager k, v
    q = fused.rope_write(qkv, cos, sin, caches[0], caches[1], slots, positions, heads, isa)
    qk, v = qkv.split([(heads + kvh) * d, kvh * d], dim=-1)
    q_eager, k_eager = rope(qk.reshape(N, heads + kvh, d), cos, sin).split([heads, kvh], dim=1)
    caches[2][slots, :, positions] = k_eager
    caches[3][slots, :, positions] = v.reshape(N, kvh, d)
    assert torch.equal(q, q_eager)
    assert torch.equal(caches[0], caches[2]) and torch.equal(caches[1], caches[3])


def test_bad_input_is_refused_with_the_reason():
    k, v = torch.zeros(2, 2, 8, 64), torch.zeros(2, 2, 8, 64)
    qkv, cs = randn(3, 8 * 64), randn(3, 64)
    with pytest.raises(RuntimeError, match="columns"):
        fused.rope_write(qkv, cs, cs, k, v, torch.tensor([0, 0, 1]), torch.tensor([0, 1, 2]), 3, ISA)
    with pytest.raises(RuntimeError, match="outside the caches"):
        fused.rope_write(qkv, cs, cs, k, v, torch.tensor([0, 0, 1]), torch.tensor([0, 1, 8]), 4, ISA)
    with pytest.raises(RuntimeError, match="multiple of 32"):
        fused.rope_write(randn(3, 8 * 16), randn(3, 16), randn(3, 16), torch.zeros(2, 2, 8, 16),
                         torch.zeros(2, 2, 8, 16), torch.tensor([0, 0, 1]),
                         torch.tensor([0, 1, 2]), 4, ISA)
    with pytest.raises(RuntimeError, match="float32"):
        fused.rms_norm(randn(2, 8).double(), randn(8), 1e-6, ISA)
    with pytest.raises(RuntimeError, match="even"):
        fused.silu_mul(randn(2, 7), ISA)
    assert fused.rope_fits(64) and not fused.rope_fits(16)


def test_a_float32_forward_on_the_fused_ops_equals_transformers():
    """hidden 128 / 4 heads: head dim 32, so RoPE and the KV write run fused too; a prefill,
    a two-request verify and a decode against a cacheless HF forward, and against the same
    forward with the fused ops off."""
    config = LlamaConfig(vocab_size=96, hidden_size=128, intermediate_size=160,
                         num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2,
                         max_position_embeddings=128, initializer_range=0.2)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32).eval()
    ids = [randn(n, seed=n).abs().mul(30).long().clamp(max=95).tolist() for n in (9, 4, 6)]
    outs = {}
    for on in (True, False):
        fwd = forward_of(model, kv_cache_dtype="model", slots=2)
        assert fwd.backend.fused and fwd.fused_rope
        fwd.backend.fused = fwd.fused_rope = on
        a, b = fwd.pool.acquire(), fwd.pool.acquire()
        out = fwd([Row(a, ids[0], logits_at=range(9)), Row(b, ids[1], logits_at=range(4))])
        out += fwd([Row(a, ids[2], logits_at=range(6))])
        outs[on] = torch.cat([out[0].logits, out[2].logits])
    with torch.no_grad():
        want = model(input_ids=torch.tensor([ids[0] + ids[2]])).logits[0]
    torch.testing.assert_close(outs[True], want, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(outs[True], outs[False], rtol=1e-4, atol=1e-4)


def test_a_stale_build_lock_is_removed_and_a_fresh_one_kept(tmp_path):
    """A build killed midway leaves torch's lock file, on which every later load waits for as
    long as it exists: one older than any build goes, a fresh one (a build running) stays."""
    import os
    import time

    from specdec.runtime.x86 import kernels

    lock = tmp_path / "specdec_probe" / "lock"
    lock.parent.mkdir()
    lock.touch()
    kernels.clear_stale_lock(lock.parent)
    assert lock.exists()
    old = time.time() - kernels.STALE_LOCK_S - 5
    os.utime(lock, (old, old))
    kernels.clear_stale_lock(lock.parent)
    assert not lock.exists()
