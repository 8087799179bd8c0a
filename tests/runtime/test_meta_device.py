"""The runtime and the target adapter on a device that is not the CPU: the ``meta`` device takes
the branches a GPU takes and raises where an op mixes it with CPU tensors (element-wise ops,
``index_copy_``, a concatenation), as CUDA does; it computes nothing, so it runs here in a
moment. One mixed batch -- a prompt chunk, a tree verify, decodes, a verify past ``SHORT`` and
tapped layers -- goes through the forward and ``TargetModel.forward_batch`` with everything on
the device, so a tensor made on the CPU and left there fails the test."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from specdec.models.target import TargetModel
from specdec.runtime import SHORT, Row, RuntimeConfig, load_forward, resolve_plan


@pytest.fixture(scope="module")
def meta_model(tiny_llama):
    model = AutoModelForCausalLM.from_pretrained(tiny_llama["target"], dtype=torch.float32)
    return model.to("meta"), AutoTokenizer.from_pretrained(tiny_llama["target"])


def plan(model, slots: int = 6):
    return resolve_plan(RuntimeConfig("meta", "float32", slots=slots, max_model_len=256),
                        model.config)


def mixed_rows() -> list[Row]:
    tree = torch.tensor([[1, 0, 0, 0], [1, 1, 0, 0], [1, 0, 1, 0], [1, 0, 1, 1]], dtype=torch.bool)
    return [Row(0, list(range(3, 3 + SHORT + 8)), [SHORT + 7], chunk=True),  # a prompt chunk
            Row(1, [5, 6, 7, 8], range(4), taps_at=range(4), ancestors=tree),  # a tree verify
            Row(2, [9], [0]), Row(3, [10], [0], taps_at=[0]),  # decodes
            Row(4, list(range(11, 11 + SHORT + 2)), range(SHORT + 2))]  # a verify past SHORT


def test_the_plan_on_meta_is_the_torch_backend(meta_model):
    p = plan(meta_model[0])
    assert (p.device, p.backend, p.linears, p.attention) == ("meta", "torch", "torch", "sdpa")
    assert p.memory.device is None and p.memory.fits  # no bound on meta


def test_a_mixed_batch_stays_on_the_device(meta_model):
    model, _ = meta_model
    forward = load_forward(model, plan(model), tap_layers=(0, 2))
    assert forward.pool.k[0].device.type == "meta" and forward.w.cos.device.type == "meta"
    for slot, cached in ((1, 20), (2, 7), (3, 64), (4, 30)):  # contexts already there
        forward.pool.advance(slot, cached)
    outs = forward(mixed_rows())
    assert [o.logits.shape[0] for o in outs] == [1, 4, 1, 1, SHORT + 2]
    assert all(o.logits.device.type == "meta" for o in outs)
    assert outs[1].taps.shape == (4, 2 * model.config.hidden_size)
    assert outs[3].taps.device.type == "meta"


def test_the_target_adapter_on_the_device(meta_model):
    model, tokenizer = meta_model
    target = TargetModel(model, tokenizer, tap_layers=(1,), plan=plan(model))
    states = [target.new_state() for _ in range(3)]
    outs = target.forward_batch(states, [list(range(3, 50)), [4], [5, 6, 7]], taps=True,
                                last_logits_only=[True, False, False])
    assert [o.logits.shape[0] for o in outs] == [1, 1, 3]
    assert outs[2].taps.device.type == "meta"
    target.crop(states[2], 1)
    again = target.forward_batch(states[1:], [[8], [9, 10]])
    assert again[1].logits.device.type == "meta"


def test_a_cpu_tensor_in_the_pass_would_fail(meta_model):
    """The technique's premise: meta refuses CPU operands where CUDA does."""
    with pytest.raises((RuntimeError, NotImplementedError)):
        _ = torch.ones(3, device="meta") + torch.ones(3)
    with pytest.raises((RuntimeError, NotImplementedError)):
        torch.zeros(4, 2, device="meta").index_copy_(0, torch.tensor([0]), torch.ones(1, 2))
