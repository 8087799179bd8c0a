"""float16 KV caches of float32 passes (``kv_cache_dtype``): the attention kernel reads them as
exactly the float32 values they hold, RoPE's write rounds as torch's conversion does, a long
prompt chunk through SDPA reads them too, and which dtype each plan's setting gives (or why it
cannot).
That a verify on them is bitwise its decodes (so speculative decoding commits plain decoding's
tokens) is ``test_attend``'s."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM, LlamaConfig

from specdec.runtime import Forward, KVPool, PlanError, Row, RuntimeConfig, Weights
from specdec.runtime.plan import KV_CACHE_DTYPES
from specdec.runtime.x86 import attend, fused
from tests.runtime.conftest import first_isa, forward_of, plan_of


def unavailable(isa: str) -> str | None:
    return attend.unavailable(isa=isa) or fused.unavailable(isa)


ISA = first_isa(unavailable)
pytestmark = pytest.mark.skipif(ISA is None, reason=f"kernels: {unavailable('avx2')}")

# head dim 32: RoPE and the KV write run fused (runtime.fused)
CONFIG = dict(vocab_size=96, hidden_size=128, intermediate_size=160, num_hidden_layers=3,
              num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
              initializer_range=0.2)


def randn(*shape, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(LlamaConfig(**CONFIG), dtype=torch.float32).eval()


def forward(model, dtype: torch.dtype, slots: int = 3) -> Forward:
    fwd = forward_of(model, slots=slots,
                     kv_cache_dtype="float16" if dtype == torch.float16 else "model")
    assert fwd.pool.dtype == dtype
    return fwd


@pytest.mark.parametrize("tree", [False, True])
def test_the_kernel_reads_float16_caches_as_the_float32_values_they_hold(tree):
    gen = torch.Generator().manual_seed(0)
    k16, v16 = (torch.randn(4, 3, 96, 64, generator=gen).half() for _ in "kv")
    rows = torch.tensor([[0, 1, 0, 0], [1, 4, 1, 16], [5, 9, 2, 40], [14, 1, 3, 95]])
    q = torch.randn(15, 9, 64, generator=gen)
    if tree:
        seen = torch.ones(15, 32, dtype=torch.uint8).tril()
        seen[7, 5] = seen[9, 6] = 0
    else:
        seen = torch.empty(0, dtype=torch.uint8)
    got = attend.attend(q, k16, v16, rows, seen, 0.125, ISA)
    assert torch.equal(got, attend.attend(q, k16.float(), v16.float(), rows, seen, 0.125, ISA))


def test_rope_writes_float16_caches_as_torch_rounds_the_float32_ones():
    heads, kvh, d, N = 6, 2, 64, 7
    qkv = randn(N, (heads + 2 * kvh) * d) * 300  # past float16's 2048: its spacing grows
    cos, sin = randn(N, 1, d, seed=2), randn(N, 1, d, seed=3)
    slots, positions = torch.tensor([0, 0, 2, 2, 2, 1, 0]), torch.tensor([5, 6, 0, 1, 2, 9, 7])
    wide = [torch.zeros(3, kvh, 16, d) for _ in "kv"]
    half = [torch.zeros(3, kvh, 16, d, dtype=torch.float16) for _ in "kv"]
    q = fused.rope_write(qkv, cos, sin, *wide, slots, positions, heads, ISA)
    q16 = fused.rope_write(qkv, cos, sin, *half, slots, positions, heads, ISA)
    assert torch.equal(q, q16)  # the queries stay float32
    for a, b in zip(wide, half, strict=True):
        assert torch.equal(a.half(), b)


@pytest.mark.parametrize("fused_rope", [True, False])
def test_float16_caches_give_the_float32_caches_logits_within_their_rounding(model, fused_rope):
    """A prompt of 40 (past the short rows: SDPA reads the caches widened), then decodes; the
    keys and values written by the fused RoPE or by the pool's own write."""
    logits = {}
    for dtype in (torch.float32, torch.float16):
        fwd = forward(model, dtype, slots=1)
        fwd.fused_rope = fused_rope
        slot = fwd.pool.acquire()
        out = [fwd([Row(slot, list(range(3, 43)), logits_at=range(40), chunk=True)])[0].logits]
        out += [fwd([Row(slot, [t], logits_at=[0])])[0].logits for t in (7, 8, 9)]
        logits[dtype] = torch.cat(out)
    wide, half = logits[torch.float32], logits[torch.float16]
    gap = (wide - half).abs().max() / wide.abs().max()
    assert 0 < gap < 1e-2, gap  # rounded (not the same caches), a few of float16's steps at most


def test_each_setting_gives_its_dtype_or_says_why_not(model):
    def kv(**knobs):
        plan = plan_of(model, **knobs)
        assert plan.kv_torch_dtype == {"float16": torch.float16,
                                       "float32": torch.float32}[plan.kv_cache_dtype]
        return plan.kv_torch_dtype

    assert KV_CACHE_DTYPES == ("auto", "model", "float16")
    assert kv() == torch.float16  # float32 passes on the kernel
    assert kv(kv_cache_dtype="float16") == torch.float16
    assert kv(kv_cache_dtype="model") == torch.float32
    assert kv(kv_cache_dtype="auto", attention="sdpa") == torch.float32
    with pytest.raises(PlanError, match="kv_cache_dtype: float16 needs float32 passes on the "
                                        "attention kernel"):
        kv(kv_cache_dtype="float16", attention="sdpa")
    with pytest.raises(PlanError, match="kv_cache_dtype must be one of"):
        RuntimeConfig(kv_cache_dtype="int8")
    from specdec.runtime.x86.backend import X86Backend

    backend = X86Backend(plan_of(model, attention="sdpa"))  # SDPA by padded groups
    weights = Weights.from_hf(model, backend)
    with pytest.raises(ValueError, match="float16 KV pool needs"):
        Forward(weights, KVPool(3, 1, 2, 128, 32, torch.float16), backend)
    kernel = X86Backend(plan_of(model))  # the attention kernel, which reads float16 only
    weights = Weights.from_hf(model, kernel)
    with pytest.raises(ValueError, match="KV pool needs"):  # another dtype than float16
        Forward(weights, KVPool(3, 1, 2, 128, 32, torch.bfloat16), kernel)
