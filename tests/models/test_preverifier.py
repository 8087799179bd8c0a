from __future__ import annotations

import pytest
import torch

from specdec.models.preverifier import PreVerifier, PreVerifierConfig


def make(**kw):
    torch.manual_seed(0)
    return PreVerifier(PreVerifierConfig(input_size=8, **kw)).eval()


def test_untrained_runs_and_gives_probabilities():
    probs = make().score(torch.randn(5, 8))
    assert probs.shape == (5,) and ((probs > 0) & (probs < 1)).all()


def test_scores_are_causal_over_the_draft():
    pv, h = make(), torch.randn(6, 8)
    torch.testing.assert_close(pv.score(h[:3]), pv.score(h)[:3])


def test_packed_steps_do_not_see_each_other():
    pv, a, b = make(), torch.randn(3, 8), torch.randn(4, 8)
    packed = torch.cat([a, b])[None]
    positions = torch.tensor([[0, 1, 2, 0, 1, 2, 3]])
    steps = torch.tensor([[0, 0, 0, 1, 1, 1, 1]])
    with torch.no_grad():
        logits = torch.sigmoid(pv(packed, positions, steps))[0]
    torch.testing.assert_close(logits[:3], pv.score(a))
    torch.testing.assert_close(logits[3:], pv.score(b))


def test_position_embedding_matters_and_can_be_ablated():
    h = torch.randn(1, 8).expand(4, 8)  # the same state at four positions
    with_pos, without = make().score(h), make(use_position=False).score(h)
    assert with_pos.unique().numel() > 1
    assert without.unique().numel() == 1 or torch.allclose(without, without[0].expand(4))


def test_save_load_roundtrip(tmp_path):
    pv, h = make(), torch.randn(4, 8)
    torch.testing.assert_close(PreVerifier.load(pv.save(tmp_path / "pv")).score(h), pv.score(h))


@pytest.mark.parametrize("kw", [{}, {"use_position": False}, {"parts": (3, 5)}])
def test_score_equals_the_forward_reference(kw):
    pv = make(**kw).double()
    h = torch.randn(7, 8, dtype=torch.float64)
    torch.testing.assert_close(pv.score(h), pv.score_reference(h), rtol=1e-12, atol=1e-12)
    assert pv.score(h[:0]).shape == (0,)
    with pytest.raises(ValueError, match="max_positions"):
        pv.score(torch.randn(65, 8, dtype=torch.float64))
