"""The float32 attention kernel of short rows (specdec/runtime/attend.cpp), each ISA's build,
against float64 SDPA: decodes, causal verifies and tree-masked rows at contexts from 0 to past a
16-key block, every head dim it takes, with and without GQA, a strided q; every token bitwise the
same alone and in any batch; the AVX2 build's outputs bitwise the AVX-512 build's; bad input
refused with the reason; and the forward on it (with the fused ops), on each ISA: float32
verifies (causal and tree) bitwise the decodes of the same tokens, and how the plan's
``attention`` picks it."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from transformers import AutoModelForCausalLM, LlamaConfig

from specdec.runtime import Forward, PlanError, Row
from specdec.runtime.x86 import attend, kernels, panels
from tests.runtime.conftest import both_builds, first_isa, forward_of, per_isa


def unavailable(isa: str) -> str | None:
    return attend.unavailable(isa=isa)


ISAS = per_isa(unavailable)
ISA = first_isa(unavailable)
pytestmark = pytest.mark.skipif(ISA is None, reason=f"attention kernel: {unavailable('avx2')}")

SLOTS, LENGTH = 4, 96


def caches(kv_heads: int, d: int, seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    return [torch.randn(SLOTS, kv_heads, LENGTH, d, generator=gen, dtype=torch.float64)
            for _ in "kv"]


def reference(q, k, v, rows, seen, scale):
    """Each token alone through float64 SDPA over exactly the keys it sees."""
    out = torch.empty(q.shape[0], q.shape[1] * q.shape[2], dtype=torch.float64)
    for start, n, slot, c in rows.tolist():
        for t in range(n):
            new = [u for u in range(t + 1) if not len(seen) or seen[start + t, u]]
            keys = list(range(c)) + [c + u for u in new]
            o = F.scaled_dot_product_attention(
                q[start + t][:, None].double(), k[slot][:, keys], v[slot][:, keys], scale=scale,
                enable_gqa=True)
            out[start + t] = o.reshape(-1)
    return out


def batch(heads: int, d: int, rows: list[tuple[int, int, int]], tree: bool, seed: int = 1):
    """q [N, heads, d], the rows table and seen (a random ancestor mask per row if ``tree``)."""
    gen = torch.Generator().manual_seed(seed)
    table, masks, start = [], [], 0
    for n, slot, c in rows:
        table.append((start, n, slot, c))
        a = torch.ones(n, n, dtype=torch.bool).tril()
        if tree:  # each token sees itself and a random subset of the earlier ones
            a &= (torch.rand(n, n, generator=gen) < 0.6) | torch.eye(n, dtype=torch.bool)
        masks.append(F.pad(a, (0, 32 - n)))
        start += n
    q = torch.randn(start, heads, d, generator=gen, dtype=torch.float64)
    seen = torch.cat(masks).to(torch.uint8) if tree else torch.empty(0, dtype=torch.uint8)
    return q, torch.tensor(table), seen


ROWS = [(1, 0, 0), (1, 1, 15), (4, 2, 16), (9, 3, 40), (3, 0, 70), (1, 1, 95)]


@pytest.mark.parametrize("d", attend.HEAD_DIMS)
@pytest.mark.parametrize("heads,kv_heads", [(4, 4), (9, 3)])
@pytest.mark.parametrize("tree", [False, True])
@pytest.mark.parametrize("isa", ISAS)
def test_the_kernel_equals_sdpa_in_float64(d, heads, kv_heads, tree, isa):
    k, v = caches(kv_heads, d)
    q, rows, seen = batch(heads, d, ROWS, tree)
    got = attend.attend(q.float(), k.float(), v.float(), rows, seen, d ** -0.5, isa)
    want = reference(q, k, v, rows, seen, d ** -0.5)
    torch.testing.assert_close(got.double(), want, rtol=0, atol=2e-5)


def test_a_strided_q_reads_as_a_contiguous_one():
    k, v = caches(3, 64)
    q, rows, seen = batch(9, 64, ROWS, False)
    wide = torch.randn(q.shape[0], 12, 64, dtype=torch.float32)
    wide[:, :9] = q.float()
    strided = wide[:, :9]
    assert not strided.is_contiguous()
    assert torch.equal(attend.attend(strided, k.float(), v.float(), rows, seen, 0.125, ISA),
                       attend.attend(q.float(), k.float(), v.float(), rows, seen, 0.125, ISA))


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("tree", [False, True])
def test_every_token_is_bitwise_its_result_alone(tree, isa):
    """A token's result is the same in any batch: in its row, next to other rows, and as a
    one-token row that sees the same keys (a decode with the visible ones cached)."""
    k, v = (c.float() for c in caches(3, 64))
    q, rows, seen = batch(9, 64, ROWS, tree)
    q = q.float()
    together = attend.attend(q, k, v, rows, seen, 0.125, isa)
    for r, (start, n, slot, c) in enumerate(rows.tolist()):
        one = rows[r:r + 1].clone()
        one[0, 0] = 0
        alone = attend.attend(q[start:start + n], k, v, one,
                              seen[start:start + n] if tree else seen, 0.125, isa)
        assert torch.equal(alone, together[start:start + n]), r
        if tree:
            continue
        for t in range(n):  # token t of a causal row: a decode at context c + t
            decode = attend.attend(q[start + t:start + t + 1], k, v,
                                   torch.tensor([[0, 1, slot, c + t]]), seen, 0.125, isa)
            assert torch.equal(decode[0], together[start + t]), (r, t)


@both_builds(unavailable)
@pytest.mark.parametrize("d", attend.HEAD_DIMS)
@pytest.mark.parametrize("cache", [torch.float32, torch.float16])
def test_the_avx2_build_is_bitwise_the_avx512_builds(d, cache):
    """Every lane the same IEEE operation, every sum the same tree (``lanes.h``): the same
    outputs to the bit, at scores whose weights run down into float32's subnormals."""
    k, v = (c.to(cache) for c in caches(3, d))
    q, rows, seen = batch(9, d, ROWS, True)
    q = q.float() * 30  # wide scores: weights e^-87 and below, subnormal
    builds = [attend.attend(q, k, v, rows, s, d ** -0.5, isa)
              for s in (seen, torch.empty(0, dtype=torch.uint8)) for isa in kernels.ISAS]
    assert torch.equal(builds[0], builds[1]) and torch.equal(builds[2], builds[3])


def test_bad_input_is_refused_with_the_reason():
    k, v = (c.float() for c in caches(3, 64))
    q, rows, seen = batch(9, 64, ROWS, False)
    q = q.float()
    with pytest.raises(RuntimeError, match="float32"):
        attend.attend(q.double(), k, v, rows, seen, 0.125, ISA)
    with pytest.raises(RuntimeError, match="does not fit"):
        attend.attend(q, k, v, torch.tensor([[0, 2, 0, 95]]), seen, 0.125, ISA)  # past the cache
    with pytest.raises(RuntimeError, match="does not fit"):
        attend.attend(q, k, v, torch.tensor([[0, 1, SLOTS, 3]]), seen, 0.125, ISA)  # no slot
    with pytest.raises(RuntimeError, match="hold"):
        attend.attend(q, k, v, rows[:2], seen, 0.125, ISA)  # rows that leave tokens out
    with pytest.raises(RuntimeError, match="head dim"):
        attend.attend(q[..., :48], k[..., :48].contiguous(), v[..., :48].contiguous(), rows,
                      seen, 0.125, ISA)
    assert attend.unavailable(48) and "not 48" in attend.unavailable(48)
    with pytest.raises(ValueError, match="not 'sse2'"):
        attend.attend(q, k, v, rows, seen, 0.125, "sse2")


# head dim 32: the fused ops (runtime.fused) run RoPE and the KV write too, where they build
CONFIG = dict(vocab_size=96, hidden_size=128, intermediate_size=160, num_hidden_layers=3,
              num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
              initializer_range=0.2)


@pytest.fixture(scope="module")
def float32_model():
    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(LlamaConfig(**CONFIG), dtype=torch.float32).eval()


def forward(model, attention: str = "auto", slots: int = 3,
            cache: torch.dtype = torch.float32, isa: str = "auto") -> Forward:
    return forward_of(model, attention=attention, slots=slots, isa=isa,
                      kv_cache_dtype="float16" if cache == torch.float16 else "model")


@pytest.mark.skipif(panels.unavailable() is not None,
                    reason=f"float32 passes are batch invariant on the panel linear: "
                           f"{panels.unavailable()}")
@pytest.mark.parametrize("cache", [torch.float32, torch.float16])
def test_float32_verifies_are_bitwise_the_decodes_of_their_tokens(float32_model, cache):
    """On the kernel a float32 token's logits do not depend on its pass: a 5-token causal verify
    next to another request, and a tree verify's branch, equal decoding the same tokens one by
    one (so speculative decoding in float32 commits exactly plain decoding's tokens), on float32
    and on float16 KV caches (``kv_cache_dtype``). The linears are the AVX-512 panels (on AVX2
    a float32 model's are oneDNN's, not batch invariant; int8 rows on AVX2 are, with this
    kernel: test_int8_avx2)."""
    fwd = forward(float32_model, cache=cache, isa="avx512")
    assert fwd.attention.kind == "kernel" and fwd.pool.dtype == cache
    prompt, draft = list(range(3, 23)), [5, 9, 11, 2, 7]
    a, b, c = (fwd.pool.acquire() for _ in range(3))
    for slot in (a, b, c):
        fwd([Row(slot, prompt, logits_at=[19], chunk=True)])
    tree = torch.tensor([[1, 0, 0, 0], [1, 1, 0, 0], [1, 0, 1, 0], [1, 0, 1, 1]], dtype=torch.bool)
    verify, branch = fwd([Row(a, draft, logits_at=range(5)),
                          Row(c, [5, 9, 11, 2], logits_at=range(4), ancestors=tree)])
    decodes = torch.cat([fwd([Row(b, [t], logits_at=[0])])[0].logits for t in draft])
    assert torch.equal(verify.logits, decodes)
    fwd.pool.crop(b, 20)  # the tree's branch 0 -> 2 -> 3, decoded: tokens 5, 11, 2
    path = torch.cat([fwd([Row(b, [t], logits_at=[0])])[0].logits for t in (5, 11, 2)])
    assert torch.equal(branch.logits[[0, 2, 3]], path)


def test_the_attention_option_picks_the_kernel_or_says_why_not(float32_model):
    """float32: the kernel, SDPA or grouped SDPA as asked (auto: the kernel); grouped and
    per-query attention are for batch-invariant float32 or bfloat16 passes, an error at plan
    time for float64 ones; float64 attends through SDPA and cannot run the kernel; bfloat16
    passes (batch invariant) cannot attend through SDPA."""
    assert forward(float32_model, "kernel").attention.kind == "kernel"
    assert forward(float32_model).attention.kind == "kernel"
    assert forward(float32_model, "sdpa").attention.kind == "sdpa"
    assert forward(float32_model, "grouped").attention.kind == "grouped"
    float64 = AutoModelForCausalLM.from_config(LlamaConfig(**CONFIG), dtype=torch.float64)
    with pytest.raises(PlanError, match="attention: grouped is for batch-invariant float32 or "
                                        "bfloat16 passes; these are float64"):
        forward_of(float64, attention="grouped", slots=1)
    assert forward_of(float64, slots=1).attention.kind == "sdpa"  # auto: float64 through SDPA
    with pytest.raises(PlanError, match="attention: kernel cannot run here: it runs float32"):
        forward_of(float64, attention="kernel", slots=1)
    bf16 = float64.to(torch.bfloat16)
    with pytest.raises(PlanError, match="attention: sdpa is for passes that are not batch "
                                        "invariant"):
        forward_of(bf16, backend="x86", attention="sdpa", slots=1)
