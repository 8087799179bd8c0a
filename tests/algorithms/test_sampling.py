"""The warped distributions (temperature, top-k, top-p, min-p): the vectorised ``warp`` against
its plain-Python reference, the truncation edges, and greedy choice left unchanged."""

from __future__ import annotations

import pytest
import torch

from specdec.algorithms.sampling import Sampling, Warp, choose, warp, warp_reference

WARPS = [Warp(0.7), Warp(1.0, top_k=2), Warp(1.3, top_p=0.6), Warp(0.9, min_p=0.2),
         Warp(1.1, top_k=4, top_p=0.8, min_p=0.05), Warp(1.0, top_k=-1), Warp(2.0, top_p=1e-6)]


@pytest.mark.parametrize("w", WARPS)
def test_warp_equals_the_reference(w):
    logits = torch.randn(6, 9, generator=torch.Generator().manual_seed(3), dtype=torch.float64)
    logits[2, 4] = logits[2, 7]  # a tie at the boundary: broken by token id in both
    fast = warp(logits, w)
    for row in range(logits.shape[0]):
        ref = warp_reference(logits[row].tolist(), w)
        assert fast[row].tolist() == pytest.approx(ref, abs=1e-12)
    assert torch.allclose(fast.sum(-1), torch.ones(6, dtype=torch.float64))


def test_truncation_keeps_what_each_setting_says():
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05]], dtype=torch.float64))
    assert (warp(logits, Warp(1.0, top_k=2)) > 0).tolist() == [[True, True, False, False]]
    # nucleus 0.75: 0.5 alone is below it, 0.5 + 0.3 reaches it -> two tokens
    assert (warp(logits, Warp(1.0, top_p=0.75)) > 0).tolist() == [[True, True, False, False]]
    assert (warp(logits, Warp(1.0, top_p=0.85)) > 0).tolist() == [[True, True, True, False]]
    # min_p 0.3: keep p >= 0.15
    assert (warp(logits, Warp(1.0, min_p=0.3)) > 0).tolist() == [[True, True, True, False]]
    assert warp(logits, Warp(1.0, top_k=1)).tolist() == [[1.0, 0.0, 0.0, 0.0]]


@pytest.mark.parametrize("bad", [dict(top_k=-2), dict(top_p=0.0), dict(top_p=1.5),
                                 dict(min_p=-0.1), dict(min_p=2.0)])
def test_bad_settings_are_refused(bad):
    with pytest.raises(ValueError, match=next(iter(bad))):
        Warp(1.0, **bad)
    with pytest.raises(ValueError, match=next(iter(bad))):
        Sampling(1.0, None, **bad)


def test_greedy_choice_ignores_truncation_and_sampling_stays_inside_it():
    logits = torch.randn(5, 30, generator=torch.Generator().manual_seed(0))
    plain, _ = choose(logits, Sampling())
    truncated, probs = choose(logits, Sampling(0.0, None, top_k=3, top_p=0.5))
    assert torch.equal(plain, truncated) and probs is None
    gen = torch.Generator().manual_seed(1)
    for _ in range(20):
        tokens, probs = choose(logits, Sampling(1.0, gen, top_k=3))
        top3 = logits.topk(3, dim=-1).indices
        assert all(int(t) in top3[i].tolist() for i, t in enumerate(tokens))
        assert int((probs > 0).sum(-1).max()) == 3
