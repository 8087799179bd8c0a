"""The panel linear run from GGUF codes (specdec/runtime/x86/qpanels.py, panels.cpp's qlinear): its
decoding is gguf-py's dequantization bitwise; its products are bitwise the float32 panel
linear's on the decoded weight, across its row tiles and its scratch path; a model loaded with
codes computes bitwise what it computes on float32 panels, whichever a pass runs on; codes that
do not decode to the weight are never run; and bad input is refused."""

from __future__ import annotations

import logging

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType, quants
from transformers import AutoModelForCausalLM, LlamaConfig

from specdec.models.gguf_blocks import Blocks, unpermute
from specdec.runtime import PlanError, Row
from specdec.runtime.x86 import panels, qpanels
from tests.runtime.conftest import forward_of, plan_of

pytestmark = pytest.mark.skipif(panels.unavailable() is not None,
                                reason=f"panel kernel: {panels.unavailable()}")
FORMATS = ("Q4_1", "Q8_0")


def quantized(w: torch.Tensor, fmt: str) -> Blocks:
    """``w`` [out, in] quantized by gguf-py, as GGUF holds it."""
    data = quants.quantize(w.float().numpy(), GGMLQuantizationType[fmt])
    return Blocks(fmt, torch.from_numpy(np.array(data)))


def decoded(blocks: Blocks) -> torch.Tensor:
    """gguf-py's float32 dequantization of ``blocks`` (what transformers loads)."""
    return torch.from_numpy(quants.dequantize(blocks.data.numpy(), GGMLQuantizationType[blocks.format]))


def case(rows: int, inputs: int, outputs: int, fmt: str, seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    blocks = quantized(torch.randn(outputs, inputs, generator=gen) * 0.05, fmt)
    return torch.randn(rows, inputs, generator=gen), blocks, torch.randn(outputs, generator=gen)


@pytest.mark.parametrize("fmt", FORMATS)
def test_the_codes_decode_to_gguf_dequantized_weights_bitwise(fmt):
    _, blocks, _ = case(1, 96, 50, fmt)
    codes = qpanels.pack(blocks, 50)
    assert qpanels.matches(codes, decoded(blocks))
    bent = decoded(blocks).clone()
    bent[7, 40] = torch.nextafter(bent[7, 40], torch.tensor(1.0))  # one weight one ulp off
    assert not qpanels.matches(codes, bent)


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("rows,inputs,outputs", [
    (1, 576, 960), (4, 64, 100), (12, 64, 33), (13, 96, 64), (40, 1536, 576)])
def test_the_linear_on_codes_is_bitwise_the_panel_linear(fmt, rows, inputs, outputs):
    """At most 12 rows decode in registers, more into a scratch copy: both bitwise the float32
    panels of the decoded weight, with and without a bias."""
    x, blocks, b = case(rows, inputs, outputs, fmt)
    codes, flat = qpanels.pack(blocks, outputs), panels.pack(decoded(blocks))
    assert torch.equal(qpanels.linear(x, codes, outputs), panels.linear(x, flat, outputs))
    assert torch.equal(qpanels.linear(x, codes, outputs, b), panels.linear(x, flat, outputs, b))
    tol = dict(rtol=0, atol=1e-4)
    torch.testing.assert_close(qpanels.linear(x.view(rows, 1, inputs), codes, outputs, b),
                               (x.double() @ decoded(blocks).double().T + b).float()[:, None], **tol)


def test_bad_input_is_refused_with_the_reason():
    x, blocks, _ = case(3, 64, 32, "Q4_1")
    codes = qpanels.pack(blocks, 32)
    kernel = panels._build()
    with pytest.raises(RuntimeError, match="float32"):
        kernel.qlinear(x.double(), codes.codes, codes.scales, 32, None)
    with pytest.raises(RuntimeError, match="inputs"):
        kernel.qlinear(torch.randn(3, 32), codes.codes, codes.scales, 32, None)
    with pytest.raises(RuntimeError, match="neither Q4_1's"):
        kernel.qlinear(x, codes.codes[..., :4].contiguous(), codes.scales, 32, None)
    with pytest.raises(RuntimeError, match="scales must be"):
        kernel.qlinear(x, codes.codes, codes.scales.float(), 32, None)
    with pytest.raises(RuntimeError, match="does not fit"):
        kernel.qlinear(x, codes.codes, codes.scales, 33, None)
    with pytest.raises(RuntimeError, match="whole blocks"):
        kernel.qlinear(torch.randn(3, 48), torch.zeros(2, 48, 8, dtype=torch.uint8),
                       torch.zeros(2, 1, 2, 16, dtype=torch.half), 32, None)


def test_rows_come_back_in_hf_order_as_transformers_unpermutes_them():
    from transformers.modeling_gguf_pytorch_utils import LlamaTensorProcessor

    rows = np.arange(48 * 3).reshape(48, 3)
    ours = unpermute(rows, 4)
    theirs = LlamaTensorProcessor()._reverse_permute_weights(rows, 4, 4)
    assert np.array_equal(ours, theirs) and not np.array_equal(ours, rows)


def quantized_llama(fmt: str):
    """A tiny float32 Llama whose weights are GGUF-quantized values, and its blocks by name."""
    config = LlamaConfig(vocab_size=96, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=True,
                         max_position_embeddings=128, initializer_range=0.2)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32).eval()
    return model, quantize_weights(model, fmt)


def quantize_weights(model, fmt: str) -> dict[str, Blocks]:
    """Every matrix of ``model`` GGUF-quantized in place (to its dequantized values); the blocks
    by parameter name."""
    blocks = {}
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() == 2:
                blocks[name] = quantized(p, fmt)
                p.copy_(decoded(blocks[name]))
    return blocks


@pytest.mark.parametrize("fmt", FORMATS)
def test_a_model_on_codes_computes_bitwise_what_it_does_on_float32_panels(fmt):
    """Passes of 1 to 12 rows (on the codes up to qpanels.ROWS, past it on the panels) and a
    prefill: every logit equal to the same forward on float32 panels alone."""
    model, blocks = quantized_llama(fmt)
    outs = []
    for linears in ("quantized", "panels"):
        fwd = forward_of(model, blocks=blocks, linears=linears, kv_cache_dtype="model", slots=4)
        projs = fwd.w.projections()
        assert all(p.kind == linears for p in projs)  # the lm_head and every layer's
        assert all((getattr(p, "codes", None) is not None) == (linears == "quantized")
                   for p in projs)
        slots = [fwd.pool.acquire() for _ in range(4)]
        got = [fwd([Row(slots[0], list(range(3, 40)), logits_at=range(37), chunk=True)])]
        for i, n in enumerate((1, 3, 12)):
            got.append(fwd([Row(slots[i + 1], list(range(5, 5 + n)), logits_at=range(n))]))
        got.append(fwd([Row(slot, [7, 8], logits_at=range(2)) for slot in slots]))
        outs.append([o.logits for step in got for o in step])
    assert all(torch.equal(a, b) for a, b in zip(*outs, strict=True))


def test_codes_that_do_not_decode_to_the_weight_are_not_run(caplog):
    model, blocks = quantized_llama("Q4_1")
    name = "model.layers.1.mlp.down_proj.weight"
    with torch.no_grad():
        model.get_parameter(name)[0, 0] += 1.0
    with caplog.at_level(logging.WARNING):
        w = forward_of(model, blocks=blocks, linears="quantized", slots=1).w
    down = w.layers[1].down
    assert down.kind == "panels" and getattr(down, "codes", None) is None
    assert down.panels is not None
    assert w.layers[0].down.kind == "quantized" and w.layers[0].down.codes is not None
    assert any(name in r.getMessage() and "do not decode" in r.getMessage() for r in caplog.records)


def test_a_config_asks_for_the_codes_and_is_told_when_there_are_none():
    from specdec.runtime.x86 import int8

    model, blocks = quantized_llama("Q4_1")

    def linears(name: str, with_blocks: bool) -> str:
        return plan_of(model, blocks if with_blocks else None, backend="x86",
                       linears=name).linears

    # auto: the int8 codes where they run, else these
    assert linears("auto", True) == ("int8" if int8.unavailable() is None else "quantized")
    assert linears("auto", False) == "panels"
    assert linears("quantized", True) == "quantized"
    with pytest.raises(PlanError, match="linears: quantized needs the model's GGUF blocks"):
        linears("quantized", False)


def test_the_default_target_runs_on_its_gguf_codes_and_computes_what_float32_does(tmp_path):
    """SmolLM2-135M (a named source): its cache keeps the GGUF's blocks, and one built before
    them gains them; every projection and the lm_head then run on codes that decode bitwise to
    the float32 weights, and a decode and a verify give the float32 panels' logits."""
    from specdec.engine.loading import load_target
    from specdec.models import gguf_blocks
    from specdec.models.sources import prepare

    sidecar = prepare("smollm2-135m") / gguf_blocks.SIDECAR
    sidecar.rename(tmp_path / "kept")  # the cache as it was before the blocks
    assert prepare("smollm2-135m") / gguf_blocks.SIDECAR == sidecar and sidecar.is_file()
    outs = []
    for linears in ("quantized", "panels"):
        target = load_target("smollm2-135m", dtype="float32", kv_slots=1, linears=linears)
        w, fwd = target.runtime.w, target.runtime
        projs = w.projections()
        assert all(p.kind == linears for p in projs)
        assert all((getattr(p, "codes", None) is not None) == (linears == "quantized")
                   for p in projs)
        slot = fwd.pool.acquire()
        fwd([Row(slot, list(range(100, 140)), logits_at=[39], chunk=True)])
        outs.append([fwd([Row(slot, [5], logits_at=[0])])[0].logits,
                     fwd([Row(slot, list(range(6, 14)), logits_at=range(8))])[0].logits])
    assert all(torch.equal(a, b) for a, b in zip(*outs, strict=True))
