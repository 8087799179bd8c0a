"""Draft-length policies, driven by a fake drafter and a scripted pre-verifier."""

from __future__ import annotations

import pytest
import torch

from specdec.algorithms.policies import (
    FixedPolicy,
    HeuristicPolicy,
    PacerPolicy,
    make_policy,
)


class Block:
    def __init__(self, n: int, start: int):
        self.hidden = torch.arange(start, start + n, dtype=torch.float32)[:, None]

    def __len__(self):
        return self.hidden.shape[0]


def fake_drafter(available: int = 1000):
    drafted = []

    def propose(n: int) -> Block:
        n = min(n, available - len(drafted))
        block = Block(n, len(drafted))
        drafted.extend(range(n))
        return block

    return propose


def scripted(scores: list[float]):
    """A scorer whose score for the token at draft position i is scores[i]."""
    return lambda hidden: torch.tensor([scores[int(i)] for i in hidden[:, 0]])


def lengths(blocks):
    return [len(b) for b in blocks]


def test_fixed_drafts_gamma_within_the_limit():
    p = FixedPolicy(gamma=4)
    assert lengths(p.draft(fake_drafter(), 10, None)) == [4]
    assert lengths(p.draft(fake_drafter(), 2, None)) == [2]
    assert p.draft(fake_drafter(), 0, None) == []


def test_heuristic_grows_by_two_and_shrinks_by_one():
    p = HeuristicPolicy(initial=5, max_len=8)
    s = p.new_state()
    p.update(s, drafted=5, accepted=5)
    assert s.length == 7
    p.update(s, drafted=7, accepted=7)
    assert s.length == 8  # capped
    p.update(s, drafted=8, accepted=3)
    assert s.length == 7
    for _ in range(10):
        p.update(s, drafted=1, accepted=0)
    assert s.length == 1


def test_pacer_stops_at_the_first_block_below_its_threshold():
    scores = [0.9, 0.9, 0.8, 0.8, 0.3, 0.3, 0.9, 0.9]
    p = PacerPolicy(scorer=scripted(scores), block_size=2, threshold=0.5, growth=1.0, max_len=8)
    trace = p.new_state()
    assert lengths(p.draft(fake_drafter(), 8, trace)) == [2, 2, 2]  # the failing block is kept
    assert trace.block_means == pytest.approx([0.9, 0.8, 0.3])


def test_pacer_threshold_grows_by_rho_after_each_passing_block():
    scores = [0.7] * 8
    grow = PacerPolicy(scorer=scripted(scores), block_size=2, threshold=0.5, growth=1.2, max_len=8)
    trace = grow.new_state()
    assert lengths(grow.draft(fake_drafter(), 8, trace)) == [2, 2, 2]  # 0.5, 0.6, 0.72 > 0.7
    assert trace.thresholds == pytest.approx([0.5, 0.6, 0.72])
    flat = PacerPolicy(scorer=scripted(scores), block_size=2, threshold=0.5, growth=1.0, max_len=8)
    assert lengths(flat.draft(fake_drafter(), 8, flat.new_state())) == [2, 2, 2, 2]


def test_pacer_threshold_is_capped_at_one():
    p = PacerPolicy(scorer=scripted([1.0] * 20), block_size=1, threshold=0.9, growth=2.0, max_len=20)
    trace = p.new_state()
    p.draft(fake_drafter(), 20, trace)
    assert max(trace.thresholds) == 1.0 and len(trace.thresholds) == 20


def test_pacer_respects_limit_max_len_and_a_drafter_that_runs_dry():
    p = PacerPolicy(scorer=scripted([1.0] * 20), block_size=3, threshold=0.1, growth=1.0, max_len=7)
    assert lengths(p.draft(fake_drafter(), 20, p.new_state())) == [3, 3, 1]
    assert lengths(p.draft(fake_drafter(), 4, p.new_state())) == [3, 1]
    assert lengths(p.draft(fake_drafter(available=5), 20, p.new_state())) == [3, 2]


@pytest.mark.parametrize("name,params,match", [
    ("nope", {}, "unknown draft policy"),
    ("fixed", {"gamma": 0}, "gamma"),
    ("pacer", {}, "pre-verifier"),
    ("pacer", {"scorer": abs, "growth": 0.9}, "rho"),
    ("pacer", {"scorer": abs, "threshold": 1.5}, "threshold"),
    ("heuristic", {"initial": 0}, "initial"),
])
def test_bad_policies_are_clear_errors(name, params, match):
    with pytest.raises(ValueError, match=match):
        make_policy(name, **params)
