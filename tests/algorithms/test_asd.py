"""ASD acceptance: the vectorised rule against the loop specification, its invariants, hand cases.

Logits are small integers plus optional small nudges, so exact ties and near-ties are common.
"""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from specdec.algorithms.asd import AsdLedger, AsdVerifier, asd_accept, asd_accept_reference
from specdec.algorithms.verify import StrictVerifier, Verdict, VerifyInputs

SETTINGS = settings(max_examples=200, deadline=None)

# Logit values: small integers, some nudged by a little, so exact ties and near-ties are common.
NEAR_TIE_VALUES = [n + d for n in range(-3, 4) for d in (0.0, 0.0, 0.0, 0.001, 0.01, 0.1, 0.5)]
TIE_VALUES = [-1.0, 0.0, 1.0]


@st.composite
def rounds(draw, ties: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """(logits [K+1, V] float64, draft [K] long) with many matches, ties and near-ties."""
    k = draw(st.integers(0, 12))
    v = draw(st.integers(2, 8))
    values = st.sampled_from(TIE_VALUES if ties else NEAR_TIE_VALUES)
    flat = draw(st.lists(values, min_size=(k + 1) * v, max_size=(k + 1) * v))
    logits = torch.tensor(flat, dtype=torch.float64).view(k + 1, v)
    return logits, draw(drafts(logits))


@st.composite
def drafts(draw, logits: torch.Tensor) -> torch.Tensor:
    """Each position: the greedy token, the LAST maximum (a tie when there are several), the
    runner-up (often a near-tie), or any token."""
    k, v = logits.shape[0] - 1, logits.shape[1]
    tokens = []
    for i in range(k):
        row = logits[i].tolist()
        ranked = sorted(range(v), key=lambda j: (-row[j], j))  # ranked[0] = y*_i
        kind = draw(st.sampled_from(["greedy", "greedy", "last_max", "runner_up", "any"]))
        if kind == "greedy":
            tokens.append(ranked[0])
        elif kind == "last_max":
            tokens.append(max(j for j in range(v) if row[j] == row[ranked[0]]))
        elif kind == "runner_up":
            tokens.append(ranked[1])
        else:
            tokens.append(draw(st.integers(0, v - 1)))
    return torch.tensor(tokens, dtype=torch.long)


# Zero settings are covered by their own test; here they occur only as float boundary cases.
budgets = st.one_of(st.just(8.0), st.just(math.inf), st.floats(0, 10))
gates = st.one_of(st.just(0.25), st.just(1.0), st.floats(0, 2))
params = st.fixed_dictionaries(
    {
        "budget": budgets,
        "gate": gates,
        "max_exceptions": st.integers(0, 4),
        "spent": st.one_of(st.just(0.0), st.floats(0, 1), st.floats(0, 10)),
        "normalized": st.booleans(),
    }
)


def strict_accepted(logits: torch.Tensor, draft: torch.Tensor) -> int:
    return StrictVerifier().verify(None, VerifyInputs(logits, draft)).accepted


@SETTINGS
@given(rounds(), params)
def test_vectorised_equals_reference(round_, kw):
    logits, draft = round_
    ref = asd_accept_reference(logits, draft, **kw)
    vec = asd_accept(logits, draft, **kw)
    assert (vec[0], vec[2]) == (ref[0], ref[2])
    assert math.isclose(vec[1], ref[1], rel_tol=1e-12, abs_tol=1e-12)


@SETTINGS
@given(rounds(), params)
def test_float32_logits_agree_with_reference(round_, kw):
    logits, draft = round_
    logits = logits.float()
    ref = asd_accept_reference(logits, draft, **kw)
    vec = asd_accept(logits, draft, **kw)
    assert (vec[0], vec[2]) == (ref[0], ref[2])
    assert math.isclose(vec[1], ref[1], rel_tol=1e-12, abs_tol=1e-12)


@SETTINGS
@given(rounds(), params)
def test_budget_and_exception_cap_hold(round_, kw):
    logits, draft = round_
    accepted, regret, exceptions = asd_accept(logits, draft, **kw)
    assert regret >= 0
    assert exceptions <= kw["max_exceptions"]
    if regret > 0:  # only rounds that spend can break the ledger
        assert regret <= kw["budget"] - kw["spent"]
    if kw["spent"] < kw["budget"]:
        # float rounding of spent + (budget - spent) may add one ulp of budget
        assert kw["spent"] + regret <= kw["budget"] * (1 + 1e-15)


@SETTINGS
@given(rounds(), params)
def test_accepts_at_least_what_strict_accepts(round_, kw):
    logits, draft = round_
    assert asd_accept(logits, draft, **kw)[0] >= strict_accepted(logits, draft)


@SETTINGS
@given(rounds(), params, budgets)
def test_larger_budget_never_commits_fewer_tokens(round_, kw, other_budget):
    logits, draft = round_
    small, large = sorted([kw["budget"], other_budget])
    assert (
        asd_accept(logits, draft, **{**kw, "budget": small})[0]
        <= asd_accept(logits, draft, **{**kw, "budget": large})[0]
    )


@SETTINGS
@given(rounds(), params)
def test_verifier_commits_accepted_prefix_then_greedy_bonus(round_, kw):
    logits, draft = round_
    spent = kw.pop("spent")
    verdict = AsdVerifier(**kw).verify(AsdLedger(spent), VerifyInputs(logits, draft))
    accepted, regret, exceptions = asd_accept(logits, draft, spent=spent, **kw)
    assert (verdict.accepted, verdict.regret, verdict.exceptions) == (accepted, regret, exceptions)
    assert verdict.tokens[:-1] == draft[:accepted].tolist()
    assert verdict.tokens[-1] == int(logits[accepted].argmax())


@SETTINGS
@given(rounds(ties=True), params, st.sampled_from(["budget", "gate", "max_exceptions"]))
def test_zero_budget_gate_or_cap_is_strict_greedy_ties_included(round_, kw, zeroed):
    logits, draft = round_
    spent = kw.pop("spent")
    kw[zeroed] = 0
    verifier = AsdVerifier(**kw)
    assert verifier.lossless
    strict = StrictVerifier().verify(None, VerifyInputs(logits, draft))
    assert verifier.verify(AsdLedger(spent), VerifyInputs(logits, draft)) == strict
    assert asd_accept_reference(logits, draft, spent=spent, **kw) == (strict.accepted, 0.0, 0)


def test_tie_mismatch_is_rejected_at_zero_gate():
    # Row 0 ties tokens 0 and 1; y*_0 = 0 (first maximum), the draft picks 1: r_0 = 0.
    logits = torch.tensor([[1.0, 1.0, 0.0], [0.0, 0.0, 2.0]], dtype=torch.float64)
    draft = torch.tensor([1])
    assert asd_accept(logits, draft, budget=8.0, gate=0.0, max_exceptions=2) == (0, 0.0, 0)
    assert asd_accept(logits, draft, budget=8.0, gate=0.25, max_exceptions=2) == (1, 0.0, 1)


def near_tie_round() -> tuple[torch.Tensor, torch.Tensor]:
    """K = 4, V = 4: x_1 = 3 is a near-tie mismatch (y*_1 = 2, r_1 = 0.1); x_2, x_3 match."""
    logits = torch.tensor(
        [
            [5.0, 0.0, 0.0, 0.0],  # y*_0 = 0 = x_0
            [0.0, 0.0, 2.0, 1.9],  # y*_1 = 2, x_1 = 3: r_1 = 2.0 - 1.9 = 0.1
            [0.0, 4.0, 0.0, 0.0],  # y*_2 = 1 = x_2 (scored under the realised prefix with x_1 = 3)
            [0.0, 0.0, 0.0, 4.0],  # y*_3 = 3 = x_3
            [0.0, 0.0, 7.0, 0.0],  # bonus y*_4 = 2
        ],
        dtype=torch.float64,
    )
    return logits, torch.tensor([0, 3, 1, 3])


def test_near_tie_mismatch_is_accepted_and_the_suffix_reused():
    logits, draft = near_tie_round()
    verdict = AsdVerifier(budget=8.0, gate=0.25, max_exceptions=2).verify(AsdLedger(),
                                                                        VerifyInputs(logits, draft))
    assert verdict.accepted == 4
    assert verdict.tokens == [0, 3, 1, 3, 2]
    assert verdict.exceptions == 1
    assert verdict.regret == pytest.approx(0.1, abs=1e-12)
    # Strict stops at the mismatch and commits the greedy correction.
    assert StrictVerifier().verify(None, VerifyInputs(logits, draft)) == Verdict(accepted=1, tokens=[0, 2])


def test_near_tie_rejected_when_the_ledger_is_nearly_spent():
    logits, draft = near_tie_round()
    kw = {"budget": 8.0, "gate": 0.25, "max_exceptions": 2}
    # B - s = 0.05 < r_1 = 0.1.
    assert asd_accept(logits, draft, spent=7.95, **kw) == (1, 0.0, 0)
    assert asd_accept(logits, draft, spent=7.85, **kw)[0] == 4


def test_gate_compares_regret_per_unit_of_value():
    # K = 4, a mismatch with r = 1.0 at position 0 (q_0 = 4): r / q = 0.25 <= g, accepted.
    logits = torch.tensor([[1.0, 0.0]] + [[0.0, 1.0]] * 4, dtype=torch.float64)
    draft = torch.tensor([1, 1, 1, 1])
    kw = {"budget": 8.0, "gate": 0.25, "max_exceptions": 2}
    assert asd_accept(logits, draft, **kw) == (4, 1.0, 1)
    # normalized: q_0 = (4 - 0) / 4 = 1, so r / q = 1.0 > g, rejected.
    assert asd_accept(logits, draft, normalized=True, **kw) == (0, 0.0, 0)
    # The same mismatch at position 3 (q_3 = 1): r / q = 1.0 > g, rejected.
    late = torch.tensor([[0.0, 1.0]] * 3 + [[1.0, 0.0], [0.0, 1.0]], dtype=torch.float64)
    assert asd_accept(late, draft, **kw) == (3, 0.0, 0)


def test_exception_cap_stops_at_the_next_mismatch():
    # Three near-tie mismatches (r = 0.1 each) at positions 0, 1, 2; M = 2 accepts two.
    row = [1.0, 0.9]
    logits = torch.tensor([row, row, row, [0.0, 1.0]], dtype=torch.float64)
    draft = torch.tensor([1, 1, 1])
    accepted, regret, exceptions = asd_accept(
        logits, draft, budget=8.0, gate=0.25, max_exceptions=2
    )
    assert (accepted, exceptions) == (2, 2)
    assert regret == pytest.approx(0.2, abs=1e-12)


def test_empty_draft_commits_only_the_bonus():
    logits = torch.tensor([[0.0, 3.0, 1.0]])
    verdict = AsdVerifier().verify(AsdLedger(1.0),
                                   VerifyInputs(logits, torch.tensor([], dtype=torch.long)))
    assert verdict == Verdict(accepted=0, tokens=[1])


def test_defaults_are_the_served_ones():
    # g and M are the authors' config; B defaults to 0 (strict) as a request's ASD always did
    assert AsdVerifier() == AsdVerifier(budget=0.0, gate=0.25, max_exceptions=2, normalized=False)
    assert AsdVerifier().lossless
    assert not AsdVerifier(budget=8.0).lossless


@pytest.mark.parametrize(
    "kw, message",
    [
        ({"budget": -1.0}, "budget"),
        ({"budget": math.nan}, "budget"),
        ({"gate": -0.1}, "gate"),
        ({"max_exceptions": -1}, "max_exceptions"),
        ({"max_exceptions": 1.5}, "max_exceptions"),
    ],
)
def test_bad_parameters_raise(kw, message):
    with pytest.raises(ValueError, match=message):
        AsdVerifier(**kw)
    full = {"budget": 8.0, "gate": 0.25, "max_exceptions": 2, **kw}
    logits, draft = near_tie_round()
    for accept in (asd_accept, asd_accept_reference):
        with pytest.raises(ValueError, match=message):
            accept(logits, draft, **full)


def test_negative_spent_raises():
    logits, draft = near_tie_round()
    with pytest.raises(ValueError, match="spent"):
        AsdVerifier().verify(AsdLedger(-1.0), VerifyInputs(logits, draft))
    with pytest.raises(ValueError, match="spent"):
        asd_accept(logits, draft, budget=8.0, gate=0.25, max_exceptions=2, spent=-1.0)


def test_the_ledger_in_the_verifier_state_carries_across_rounds():
    """The state ``new_state()`` makes is the ledger a caller used to keep: round after round
    the verdicts equal ``asd_accept`` with ``spent`` summed by hand, and so does the ledger."""
    gen = torch.Generator().manual_seed(3)
    verifier = AsdVerifier(budget=2.0, gate=1.0, max_exceptions=2)
    state, spent = verifier.new_state(), 0.0
    for _ in range(40):
        logits = torch.randn(5, 6, generator=gen, dtype=torch.float64)
        draft = torch.randint(0, 6, (4,), generator=gen)
        verdict = verifier.verify(state, VerifyInputs(logits, draft))
        expected = asd_accept(logits, draft, budget=2.0, gate=1.0, max_exceptions=2, spent=spent)
        assert (verdict.accepted, verdict.regret, verdict.exceptions) == expected
        spent += verdict.regret
        assert state.spent == spent <= 2.0
    assert spent > 0  # some near-ties were accepted
