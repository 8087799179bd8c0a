"""The drafter side (``load_drafter_side``): the drafter a process loads without the target
drafts exactly what the drafter loaded beside the target does, reads only the target's
embedding and lm_head for a block drafter (no ``TargetModel``, no KV pool), and runs on a GPU
(the stand-in, ``tests.device_guard``) with the target's CPU features."""

from __future__ import annotations

import pytest
import torch

from specdec.algorithms.verify import make_verifier
from specdec.engine.loading import load_drafter_side, load_pair
from specdec.models.target import TargetModel
from specdec.training.simulation import simulate_request
from tests.device_guard import GuardedCuda

PROMPT = list(b"def f(x):\n    return")


@pytest.fixture(scope="module")
def pair(tiny_llama):
    return load_pair(tiny_llama["target"], tiny_llama["block-drafter"], dtype="float64")


def records(target, drafter):
    """Greedy SD on the CPU target with ``drafter``: every drafted token, hidden state and label."""
    return simulate_request(target, drafter, make_verifier("strict"), PROMPT, 12,
                            drafter.max_draft_len, 3)


def test_a_block_drafter_alone_drafts_what_it_drafts_beside_the_target(tiny_llama, pair):
    ref = records(pair.target, pair.drafter)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(TargetModel, "__init__", lambda *a, **k: pytest.fail("built a TargetModel"))
        alone = load_drafter_side(tiny_llama["block-drafter"], tiny_llama["target"], "float64")
    assert torch.equal(alone.embedding, pair.drafter.embedding)
    assert torch.equal(alone.lm_head, pair.drafter.lm_head)
    assert records(pair.target, alone) == ref


def test_self_alone_is_the_target_language_model(tiny_llama, pair):
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(TargetModel, "__init__", lambda *a, **k: pytest.fail("built a TargetModel"))
        alone = load_drafter_side("self", tiny_llama["target"], "float64")
    beside = load_pair(tiny_llama["target"], "self", dtype="float64").drafter
    for a, b in zip(alone.model.parameters(), beside.model.parameters(), strict=True):
        assert torch.equal(a, b)


def test_a_block_drafter_on_the_gpu_takes_cpu_features(tiny_llama, pair, monkeypatch):
    ref = records(pair.target, pair.drafter)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)  # parse_device("cuda")
    with GuardedCuda() as guard:
        drafter = load_drafter_side(tiny_llama["block-drafter"], tiny_llama["target"], "float64",
                                    device="cuda")
        assert drafter.device.type == "cuda" and guard.on_gpu(drafter.net.fc.weight)
        assert records(pair.target, drafter) == ref
