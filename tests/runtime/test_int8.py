"""The linear on GGUF codes times int8 rows (specdec/runtime/x86/int8.py, int8.cpp): its rows are
quantized as llama.cpp's Q8 blocks are; its products are the exact integer products, scaled,
across the row tiles; every row's outputs are bitwise its outputs alone, in any batch and on
any number of threads, on AMX tiles as on vpdpbusd; a model on it decodes the same tokens with
speculation as without; the plan's ``linears: auto`` picks it for a model with blocks (and
``dtype: auto`` float32 for it); and bad input is refused."""

from __future__ import annotations

import pytest
import torch

from specdec.engine.engine import Engine
from specdec.engine.settings import GenerationParams, SpecSettings
from specdec.models.ngram import NgramDrafter
from specdec.models.target import TargetModel
from specdec.runtime import Forward, PlanError, Row
from specdec.runtime.x86 import int8
from tests.conftest import PROMPTS
from tests.runtime.conftest import forward_of, plan_of
from tests.runtime.test_qpanels import FORMATS, case, decoded, quantize_weights, quantized_llama

pytestmark = pytest.mark.skipif(int8.unavailable() is not None,
                                reason=f"int8 kernel: {int8.unavailable()}")


def test_rows_are_quantized_per_block_of_32_as_llama_cpp_does():
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(3, 96, generator=gen) * torch.tensor([1.0, 30.0, 1e-3])[:, None]
    x[2, 32:64] = 0.0  # an all-zero block: scale 0, codes 0
    q, d, s, total = int8.quantize_rows(x)
    blocks = x.view(3, 3, 32)
    assert torch.equal(d, blocks.abs().amax(-1) / 127)
    assert q.dtype == torch.int8 and int(q.abs().max()) == 127
    assert torch.equal(total, q.view(3, 3, 32).int().sum(-1)) and torch.equal(s, d * total)
    back = q.view(3, 3, 32).float() * d[..., None]
    assert bool(((back - blocks).abs() <= d[..., None] * 0.5 * (1 + 1e-5)).all())
    assert not q.view(3, 3, 32)[2, 1].any() and d[2, 1] == 0


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("rows,inputs,outputs", [(1, 32, 16), (5, 64, 40), (12, 96, 33),
                                                 (13, 64, 48), (30, 128, 100)])
def test_the_product_is_the_exact_integer_product_scaled(fmt, rows, inputs, outputs):
    """Against float64 from torch's integer products: within float32's rounding of the sums."""
    x, blocks, bias = case(rows, inputs, outputs, fmt)
    w = int8.pack(blocks, outputs)
    want = int8.reference(x, blocks, outputs)
    scale = float(want.abs().max())
    assert torch.allclose(int8.linear(x, w).double(), want, rtol=0, atol=2e-6 * scale)
    with_bias = int8.linear(x, w, bias).double()
    assert torch.allclose(with_bias, want + bias.double(), rtol=0, atol=2e-6 * scale + 1e-6)


@pytest.mark.parametrize("fmt", FORMATS)
def test_it_is_close_to_the_float32_product_of_the_dequantized_weight(fmt):
    """Only the rows' rounding to int8 separates them: well under 1% of the outputs' size."""
    x, blocks, _ = case(8, 256, 64, fmt)
    exact = x.double() @ decoded(blocks).double().T
    got = int8.linear(x, int8.pack(blocks, 64)).double()
    assert float((got - exact).abs().max()) < 0.01 * float(exact.abs().max())


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("threads", [1, 2])
def test_every_row_is_bitwise_its_outputs_alone(fmt, threads):
    """Batches of 2 to 40 rows (across the 12-row tiles) and their slices, each row against the
    row alone, on one thread and two."""
    x, blocks, bias = case(40, 96, 80, fmt, seed=3)
    w = int8.pack(blocks, 80)
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        alone = torch.cat([int8.linear(x[i:i + 1], w, bias) for i in range(40)])
        for m in (2, 11, 12, 13, 25, 40):
            for lo in range(0, 40 - m + 1, m):
                got = int8.linear(x[lo:lo + m], w, bias)
                assert torch.equal(got.view(torch.int32), alone[lo:lo + m].view(torch.int32)), m
    finally:
        torch.set_num_threads(before)


@pytest.mark.skipif(not int8.amx(), reason="no AMX int8 tiles here")
@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("threads", [1, 2])
def test_amx_tiles_give_bitwise_the_vpdpbusd_outputs(fmt, threads):
    """The tile path against the vpdpbusd one on the same rows: 1 to 40 rows (whole and partial
    16-row tiles), 1 to 8 blocks (the tiles' groups of four and the blocks left over), with and
    without a bias; and both near the exact integer products."""
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        for rows, inputs, outputs in [(1, 32, 16), (5, 96, 40), (16, 128, 33), (17, 160, 48),
                                      (40, 256, 80)]:
            x, blocks, bias = case(rows, inputs, outputs, fmt, seed=rows)
            w = int8.pack(blocks, outputs)
            for b in (None, bias):
                tiles = int8.linear(x, w, b, amx_rows=1)
                vnni = int8.linear(x, w, b, amx_rows=0)
                assert torch.equal(tiles.view(torch.int32), vnni.view(torch.int32)), (rows, inputs)
                want = int8.reference(x, blocks, outputs) + (0 if b is None else b.double())
                assert torch.allclose(tiles.double(), want, rtol=0,
                                      atol=2e-6 * float(want.abs().max()) + 1e-6)
    finally:
        torch.set_num_threads(before)


@pytest.mark.skipif(not int8.amx(), reason="no AMX int8 tiles here")
def test_amx_tiles_hold_after_onednn_loaded_its_own_tile_configuration():
    """oneDNN runs bfloat16 linears on AMX tiles with configurations of its own, in the same
    threads: the int8 linear loads its own each call, so its products stay bitwise."""
    x, blocks, bias = case(33, 128, 48, "Q4_1", seed=5)
    w = int8.pack(blocks, 48)
    want = int8.linear(x, w, bias, amx_rows=0)
    a, b = torch.randn(64, 576).bfloat16(), torch.randn(200, 576).bfloat16()
    for _ in range(3):
        torch.nn.functional.linear(a, b)  # oneDNN's AMX bfloat16 kernel where it runs
        assert torch.equal(int8.linear(x, w, bias, amx_rows=1).view(torch.int32),
                           want.view(torch.int32))


def test_bad_input_is_refused_with_the_reason():
    x, blocks, _ = case(3, 64, 32, "Q4_1")
    w = int8.pack(blocks, 32)
    with pytest.raises(RuntimeError, match="float32"):
        int8.linear(x.double(), w)
    with pytest.raises(RuntimeError, match="inputs"):
        int8.linear(torch.randn(3, 96), w)
    with pytest.raises(RuntimeError, match="does not fit"):
        int8._build().linear(x, w.codes, w.scales, 33, None, 0)
    with pytest.raises(RuntimeError, match="bias"):
        int8.linear(x, w, torch.randn(31))
    with pytest.raises(RuntimeError, match="neither"):
        int8._build().linear(x, w.codes[:, :, :100].contiguous(), w.scales, 32, None, 0)
    with pytest.raises(RuntimeError, match="scales"):
        int8._build().linear(x, w.codes, w.scales.float(), 32, None, 0)


def forward_on(model, linears: str, blocks=None, slots: int = 4) -> Forward:
    return forward_of(model, blocks=blocks, linears=linears, kv_cache_dtype="model", slots=slots)


@pytest.mark.parametrize("fmt", FORMATS)
def test_a_model_on_int8_gives_each_request_its_logits_alone_in_a_ragged_batch(fmt):
    """A tiny GGUF-quantized Llama: requests of 1 to 12 new tokens after their prompts, in one
    pass, bitwise as each runs alone; and near the float32 panels' logits."""
    model, blocks = quantized_llama(fmt)
    projs = forward_on(model, "int8", blocks).w.projections()
    assert all(p.kind == "int8" and getattr(p, "panels", None) is None for p in projs)
    prompts = [list(range(3, 3 + n)) for n in (37, 5, 20, 9)]
    news = [[7], [8, 9, 10], list(range(11, 23)), [4, 5]]

    def run(together: bool):
        fwd = forward_on(model, "int8", blocks)
        slots = [fwd.pool.acquire() for _ in prompts]
        for slot, p in zip(slots, prompts, strict=True):
            fwd([Row(slot, p, logits_at=[len(p) - 1], chunk=True)])
        rows = [Row(s, n, logits_at=range(len(n))) for s, n in zip(slots, news, strict=True)]
        outs = fwd(rows) if together else [fwd([r])[0] for r in rows]
        return [o.logits for o in outs]

    together, alone = run(True), run(False)
    assert all(torch.equal(a, b) for a, b in zip(together, alone, strict=True))
    fwd = forward_on(model, "panels")
    slot = fwd.pool.acquire()
    fwd([Row(slot, prompts[0], logits_at=[36], chunk=True)])
    exact = fwd([Row(slot, news[0], logits_at=[0])])[0].logits
    assert float((together[0] - exact).abs().max()) < 0.05 * float(exact.abs().max())


def quantized_target(tiny_llama, fmt: str = "Q4_1", **knobs) -> TargetModel:
    """The tiny Llama in float32, its linears GGUF-quantized, on the int8 linears (``knobs``:
    the target's other runtime knobs, e.g. ``isa``)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(tiny_llama["target"], dtype=torch.float32)
    blocks = quantize_weights(model, fmt)
    return TargetModel(model, AutoTokenizer.from_pretrained(tiny_llama["target"]),
                       pool_size=4, linears="int8", blocks=blocks, **knobs)


def test_speculation_on_int8_commits_plain_decodings_tokens(tiny_llama):
    """Strict greedy and ASD with B = 0, drafting with n-grams, against plain decoding on the same
    int8 target: token for token."""
    target = quantized_target(tiny_llama)
    assert target.runtime.w.lm_head.kind == "int8"
    check_speculation_commits_plain_decodings_tokens(target)


def check_speculation_commits_plain_decodings_tokens(target: TargetModel) -> None:
    """Strict greedy, heuristic and ASD (B = 0) drafts of n-grams commit plain decoding's
    tokens on ``target``, token for token."""
    plain = Engine(target)
    spec = Engine(target, NgramDrafter(target.vocab_size))
    settings = [SpecSettings(gamma=4), SpecSettings(policy="heuristic", max_draft=8),
                SpecSettings(gamma=6, verify="asd", asd_budget=0.0, asd_gate=0.5,
                             asd_max_exceptions=2)]
    for prompt in PROMPTS:
        ids = target.tokenizer(prompt)["input_ids"]
        want = plain.generate(ids, GenerationParams(max_new_tokens=40)).token_ids
        for s in settings:
            out = spec.generate(ids, GenerationParams(max_new_tokens=40, spec=s))
            assert out.token_ids == want, (prompt, s.policy, s.verify)
        assert len(want) > 0


def test_auto_picks_int8_for_a_model_with_blocks_and_int8_needs_them():
    model, blocks = quantized_llama("Q4_1")

    def plan(with_blocks: bool, **knobs):
        return plan_of(model, blocks if with_blocks else None, backend="x86", **knobs)

    assert plan(True).linears == "int8" and plan(True, linears="int8").linears == "int8"
    assert plan(False).linears != "int8" and plan(True, linears="quantized").linears == "quantized"
    auto = plan(True, dtype="auto")  # float32, whose linears run int8 rows
    assert auto.dtype == "float32" and auto.linears == "int8"
    with pytest.raises(PlanError, match="linears: int8 needs the model's GGUF blocks"):
        plan(False, linears="int8")


def test_the_default_target_on_auto_runs_int8_and_a_verify_is_its_decodes():
    """SmolLM2-135M (a named source, its GGUF's blocks beside it) on ``linears: auto``: every
    projection and the lm_head on the int8 kernel; a verify of 8 tokens on two threads gives
    bitwise the logits of the 8 decodes one by one on one thread (so threads by load never
    change a token), and near the float32 panels' (the rows' rounding to int8)."""
    from specdec.engine.loading import load_target

    logits, before = {}, torch.get_num_threads()
    try:
        for linears in ("auto", "panels"):
            torch.set_num_threads(2)  # a governor leaves its last pass's count set
            target = load_target("smollm2-135m", dtype="float32", kv_slots=2, linears=linears)
            w, fwd = target.runtime.w, target.runtime
            projs = w.projections()
            assert all((p.kind == "int8") == (linears == "auto") for p in projs)
            assert target.plan.threads_by_load
            slots = [fwd.pool.acquire() for _ in range(2)]
            for slot, threads in zip(slots, (2, 1), strict=True):
                pin(fwd, threads)
                fwd([Row(slot, list(range(100, 140)), logits_at=[39], chunk=True)])
            new = list(range(6, 14))
            pin(fwd, 2)
            verify = fwd([Row(slots[0], new, logits_at=range(8))])[0].logits
            if linears == "auto":
                pin(fwd, 1)
                decodes = torch.cat([fwd([Row(slots[1], [t], logits_at=[0])])[0].logits
                                     for t in new])
                assert torch.equal(verify, decodes)
            logits[linears] = verify
    finally:
        torch.set_num_threads(before)
    gap = float((logits["auto"] - logits["panels"]).abs().max())
    assert 0 < gap < 0.1 * float(logits["panels"].abs().max())


def pin(fwd: Forward, threads: int) -> None:
    """The forward's passes from now on at ``threads`` (its governor's choice pinned)."""
    fwd.governor.choose = lambda tokens: (threads, False)


def test_the_default_target_on_dtype_auto_is_float32_on_int8_rows():
    """``dtype: auto`` (the served default) loads SmolLM2-135M in float32 wherever its linears
    run int8 rows, on an AMX CPU too, and when they are off, the plan's pick: bfloat16 on a CPU
    with AMX, else float32."""
    from specdec.engine.loading import load_target
    from specdec.runtime.plan import cpu_flags

    target = load_target("smollm2-135m", dtype="auto", kv_slots=1)
    assert target.dtype is torch.float32 and target.runtime.w.lm_head.kind == "int8"
    plain = load_target("smollm2-135m", dtype="auto", kv_slots=1, linears="onednn")
    assert plain.dtype is (torch.bfloat16 if "amx_bf16" in cpu_flags() else torch.float32)
    assert plain.runtime.w.lm_head.kind == "onednn"
