"""Losslessness, the first invariant: every drafter x policy with strict verification, and ASD
with B = 0, yields exactly the target's greedy tokens (float64 tiny models)."""

from __future__ import annotations

import pytest

from specdec.engine.engine import Engine
from specdec.engine.loading import load_pair, untrained_preverifier
from specdec.engine.settings import GenerationParams, SpecSettings
from tests.conftest import PROMPTS, greedy_reference

DRAFTERS = ["none", "ngram", "self", "drafter", "noisy", "block-drafter"]
POLICIES = ["fixed", "heuristic", "pacer"]
N = 32


def engine_for(tiny, drafter: str) -> Engine:
    ref = tiny.get(drafter, drafter)
    pair = load_pair(tiny["target"], ref, dtype="float64")
    pre = untrained_preverifier(pair.drafter) if pair.drafter is not None else None
    return Engine(pair.target, pair.drafter, pre)


@pytest.fixture(scope="module")
def expected(tiny):
    pair = load_pair(tiny["target"], "none", dtype="float64")
    tok, eos = pair.target.tokenizer, pair.target.eos_token_ids
    return {p: greedy_reference(pair.target.model, tok(p)["input_ids"], N, eos) for p in PROMPTS}


@pytest.mark.parametrize("drafter", DRAFTERS)
def test_every_policy_with_strict_and_asd_b0_is_greedy(tiny, expected, drafter):
    engine = engine_for(tiny, drafter)
    tok = engine.target_worker.target_model.tokenizer
    settings = [SpecSettings(policy=p, gamma=3, block_size=2, threshold=0.4, max_draft=8)
                for p in POLICIES]
    settings += [SpecSettings(policy=p, verify="asd", asd_budget=0.0, asd_gate=0.5,
                              asd_max_exceptions=2) for p in POLICIES]
    for prompt in PROMPTS[:2]:
        ids = tok(prompt)["input_ids"]
        for spec in settings:
            out = engine.generate(ids, GenerationParams(max_new_tokens=N, spec=spec))
            assert out.token_ids == expected[prompt], (drafter, spec.policy, spec.verify, prompt)
            assert out.stats.committed == len(out.token_ids)
            assert out.stats.regret_spent == 0.0


@pytest.mark.parametrize("gamma", [1, 3, 5])
def test_target_as_own_drafter_accepts_every_token(tiny, gamma):
    engine = engine_for(tiny, "self")
    ids = engine.target_worker.target_model.tokenizer(PROMPTS[1])["input_ids"]
    out = engine.generate(ids, GenerationParams(max_new_tokens=N, spec=SpecSettings(gamma=gamma)))
    s = out.stats
    full_rounds = s.rounds - 1  # the last round may be cut short by the token budget
    assert s.draft_lengths[gamma] >= full_rounds
    assert s.accepted == s.drafted, s.to_dict()
    assert s.accepted_at[:gamma] == s.drafted_at[:gamma]


def test_partial_acceptance_is_exercised(tiny, expected):
    """The noisy drafter must accept some tokens and reject others, so crops happen mid-draft."""
    engine = engine_for(tiny, "noisy")
    ids = engine.target_worker.target_model.tokenizer(PROMPTS[0])["input_ids"]
    out = engine.generate(ids, GenerationParams(max_new_tokens=N, spec=SpecSettings(gamma=4)))
    assert out.token_ids == expected[PROMPTS[0]]
    assert 0 < out.stats.accepted < out.stats.drafted


def test_asd_with_budget_stays_within_budget(tiny):
    engine = engine_for(tiny, "noisy")
    ids = engine.target_worker.target_model.tokenizer(PROMPTS[0])["input_ids"]
    for budget in [0.5, 2.0, 8.0]:
        spec = SpecSettings(gamma=4, verify="asd", asd_budget=budget, asd_gate=1.0,
                            asd_max_exceptions=2)
        out = engine.generate(ids, GenerationParams(max_new_tokens=N, spec=spec))
        assert len(out.token_ids) == N or out.finish_reason == "stop"
        assert 0.0 <= out.stats.regret_spent <= budget + 1e-9
