"""The int8 linear's AVX2 build (specdec/runtime/x86/int8.cpp on lanes.h's AVX2 vectors,
``isa="avx2"``): its products are the exact integer products, scaled, with no int16 saturation at
the codes' extremes; its quantized rows and outputs are bitwise the AVX-512 VNNI build's where
both run; every row's outputs are bitwise its outputs alone; and a model on it (``isa: avx2``,
as on a CPU without AVX-512) gives each request its logits alone and decodes the same tokens
with speculation as without. How the plan picks it: tests/runtime/test_plan_auto.py."""

from __future__ import annotations

import pytest
import torch

from specdec.models.gguf_blocks import Blocks
from specdec.runtime import Row
from specdec.runtime.x86 import int8
from tests.runtime.conftest import forward_of
from tests.runtime.test_int8 import (
    check_speculation_commits_plain_decodings_tokens,
    pin,
    quantized_target,
)
from tests.runtime.test_qpanels import FORMATS, case, quantized_llama

pytestmark = pytest.mark.skipif(int8.unavailable("avx2") is not None,
                                reason=f"int8 kernel (avx2): {int8.unavailable('avx2')}")
VNNI = pytest.mark.skipif(int8.unavailable() is not None,
                          reason=f"int8 kernel (avx512): {int8.unavailable()}")
SHAPES = [(1, 32, 16), (3, 64, 40), (4, 96, 33), (5, 64, 48), (13, 128, 100)]


def avx2(x, w, bias=None):
    return int8.linear(x, w, bias, isa="avx2")


def test_rows_are_quantized_per_block_of_32_as_llama_cpp_does():
    """Scale max |x| / 127, codes x / scale rounded to nearest (within half a step), their sums;
    an all-zero block has scale 0 and codes 0."""
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(3, 96, generator=gen) * torch.tensor([1.0, 30.0, 1e-3])[:, None]
    x[2, 32:64] = 0.0
    q, d, s, total = int8.quantize_rows(x, "avx2")
    blocks = x.view(3, 3, 32)
    assert torch.equal(d, blocks.abs().amax(-1) / 127)
    assert q.dtype == torch.int8 and int(q.abs().max()) == 127
    assert torch.equal(total, q.view(3, 3, 32).int().sum(-1)) and torch.equal(s, d * total)
    back = q.view(3, 3, 32).float() * d[..., None]
    assert bool(((back - blocks).abs() <= d[..., None] * 0.5 * (1 + 1e-5)).all())
    assert not q.view(3, 3, 32)[2, 1].any() and d[2, 1] == 0


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("rows,inputs,outputs", SHAPES)
def test_the_product_is_the_exact_integer_product_scaled(fmt, rows, inputs, outputs):
    """Against float64 from torch's integer products of the same codes: the kernel's integer
    sums are exact, so only float32's rounding of each block's terms and their running sum
    (a few ulps of the largest output over these 1-4 blocks) separates them."""
    x, blocks, bias = case(rows, inputs, outputs, fmt)
    w = int8.pack(blocks, outputs)
    want = int8.reference(x, blocks, outputs, "avx2")
    scale = float(want.abs().max())
    assert torch.allclose(avx2(x, w).double(), want, rtol=0, atol=2e-6 * scale)
    assert torch.allclose(avx2(x, w, bias).double(), want + bias.double(), rtol=0,
                          atol=2e-6 * scale + 1e-6)


@pytest.mark.parametrize("fmt", FORMATS)
def test_the_codes_extremes_do_not_saturate(fmt):
    """Every row code +-127 and every weight code at its extreme (Q8_0: -128 and 127, Q4_1: 15),
    where vpmaddubsw's int16 pair sums are largest (2 * 128 * 127): the exact integer product."""
    out, inputs = 32, 64
    gen = torch.Generator().manual_seed(1)
    signs = torch.randint(0, 2, (out, inputs // 32, 32), generator=gen, dtype=torch.uint8)
    d = torch.full((out, inputs // 32, 1), 0.01).half().view(torch.uint8)
    if fmt == "Q8_0":
        qs = torch.where(signs.bool(), 127, -128).to(torch.int8)
        data = torch.cat([d, qs.view(torch.uint8)], dim=-1)
    else:
        m = torch.full((out, inputs // 32, 1), -0.05).half().view(torch.uint8)
        data = torch.cat([d, m, torch.full((out, inputs // 32, 16), 0xFF, dtype=torch.uint8)],
                         dim=-1)
    blocks = Blocks(fmt, data.reshape(out, -1))
    x = torch.where(torch.rand(6, inputs, generator=gen) < 0.5, -1.0, 1.0) * 3.0
    assert int(int8.quantize_rows(x, "avx2")[0].abs().min()) == 127
    want = int8.reference(x, blocks, out, "avx2")
    got = avx2(x, int8.pack(blocks, out)).double()
    assert torch.allclose(got, want, rtol=0, atol=2e-6 * float(want.abs().max()))


@VNNI
@pytest.mark.parametrize("fmt", FORMATS)
def test_its_rows_and_outputs_are_bitwise_the_vnni_builds(fmt):
    """The same rows, quantized the same (codes, scales, sums), and the same outputs bit for bit,
    with and without a bias. With one block (32 inputs) an output is its integer sum times one
    scale, so equal outputs there are equal int32 block sums; past it, the same float chain."""
    for seed, (rows, inputs, outputs) in enumerate([(7, 32, 40), *SHAPES, (40, 256, 80)]):
        x, blocks, bias = case(rows, inputs, outputs, fmt, seed=seed)
        for a, b in zip(int8.quantize_rows(x, "avx2"), int8.quantize_rows(x), strict=True):
            assert torch.equal(a, b)
        w = int8.pack(blocks, outputs)
        for bb in (None, bias):
            got, vnni = avx2(x, w, bb), int8.linear(x, w, bb, amx_rows=0)
            assert torch.equal(got.view(torch.int32), vnni.view(torch.int32)), (rows, inputs)


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("threads", [1, 2])
def test_every_row_is_bitwise_its_outputs_alone(fmt, threads):
    """Batches of 2 to 40 rows (across the AVX2 build's 4-row tiles) and their slices, each row
    against the row alone, on one thread and two."""
    x, blocks, bias = case(40, 96, 80, fmt, seed=3)
    w = int8.pack(blocks, 80)
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        alone = torch.cat([avx2(x[i:i + 1], w, bias) for i in range(40)])
        for m in (2, 3, 4, 5, 9, 40):
            for lo in range(0, 40 - m + 1, m):
                got = avx2(x[lo:lo + m], w, bias)
                assert torch.equal(got.view(torch.int32), alone[lo:lo + m].view(torch.int32)), m
    finally:
        torch.set_num_threads(before)


def test_an_unknown_isa_is_refused():
    x, blocks, _ = case(1, 32, 16, "Q8_0")
    with pytest.raises(ValueError, match="not 'sse2'"):
        int8.linear(x, int8.pack(blocks, 16), isa="sse2")


@pytest.mark.parametrize("fmt", FORMATS)
def test_a_model_on_avx2_int8_gives_each_request_its_logits_alone(fmt):
    """A tiny GGUF-quantized Llama with ``isa: avx2``: int8 rows, the attention and the fused
    steps on their AVX2 builds; requests of 1 to 12 new tokens after their prompts, in one pass,
    bitwise as each runs alone."""
    model, blocks = quantized_llama(fmt)

    def forward():
        return forward_of(model, blocks=blocks, linears="int8", isa="avx2", slots=4)

    fwd = forward()
    plan = fwd.backend.plan
    assert plan.isa == "avx2" and plan.batch_invariant and plan.fused
    assert plan.attention == "kernel" and "AVX2" in plan.numerics
    assert all(p.kind == "int8" and p.isa == "avx2" for p in fwd.w.projections())
    prompts = [list(range(3, 3 + n)) for n in (37, 5, 20, 9)]
    news = [[7], [8, 9, 10], list(range(11, 23)), [4, 5]]

    def run(together: bool):
        fwd = forward()
        slots = [fwd.pool.acquire() for _ in prompts]
        for slot, p in zip(slots, prompts, strict=True):
            fwd([Row(slot, p, logits_at=[len(p) - 1], chunk=True)])
        rows = [Row(s, n, logits_at=range(len(n))) for s, n in zip(slots, news, strict=True)]
        outs = fwd(rows) if together else [fwd([r])[0] for r in rows]
        return [o.logits for o in outs]

    together, alone = run(True), run(False)
    assert all(torch.equal(a, b) for a, b in zip(together, alone, strict=True))


def test_speculation_on_avx2_int8_commits_plain_decodings_tokens(tiny_llama):
    """The tiny Llama target, its linears GGUF-quantized, on the AVX2 int8 rows (``isa:
    avx2``): strict greedy and ASD with B = 0, drafting with n-grams, token for token plain
    decoding's on the same target."""
    target = quantized_target(tiny_llama, isa="avx2")
    assert target.plan.isa == "avx2" and target.plan.batch_invariant
    assert target.runtime.w.lm_head.kind == "int8" and target.runtime.w.lm_head.isa == "avx2"
    check_speculation_commits_plain_decodings_tokens(target)


def test_the_default_target_on_isa_avx2_runs_int8_and_a_verify_is_its_decodes():
    """SmolLM2-135M (its GGUF's blocks beside it) with ``isa: avx2``, as on a CPU without
    AVX-512: every projection and the lm_head on the AVX2 int8 kernel, and a verify of 8 tokens
    gives bitwise the logits of the 8 decodes one by one (batch invariant), the verify on two
    threads as served and the decodes on one, as threads by load may run them."""
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        check_a_verify_is_its_decodes()
    finally:
        torch.set_num_threads(before)


def check_a_verify_is_its_decodes():
    from specdec.engine.loading import load_target

    target = load_target("smollm2-135m", dtype="auto", kv_slots=2, isa="avx2")
    fwd = target.runtime
    assert target.plan.isa == "avx2" and target.plan.batch_invariant
    assert target.plan.attention == "kernel" and target.plan.fused
    assert all(p.kind == "int8" and p.isa == "avx2" for p in fwd.w.projections())
    slots = [fwd.pool.acquire() for _ in range(2)]
    for slot, threads in zip(slots, (2, 1), strict=True):  # threads by load: either count
        pin(fwd, threads)
        fwd([Row(slot, list(range(100, 140)), logits_at=[39], chunk=True)])
    new = list(range(6, 14))
    pin(fwd, 2)
    verify = fwd([Row(slots[0], new, logits_at=range(8))])[0].logits
    pin(fwd, 1)
    decodes = torch.cat([fwd([Row(slots[1], [t], logits_at=[0])])[0].logits for t in new])
    assert torch.equal(verify, decodes)
