"""Rejection sampling: a statistical losslessness test (with negative controls) and the edges.

The statistical test simulates full speculative decoding against a target whose logits do not
depend on the prefix (row j is the target at absolute position j), drafts K = 3 tokens per round
and runs rounds until two tokens are committed. Lossless means the first two committed tokens
are distributed as p_0(t0) * p_1(t1). With a fixed seed the test is deterministic; the
tolerance is a chi-square critical value at significance 0.001.
"""

from __future__ import annotations

import math

import pytest
import torch

from specdec.algorithms import rejection
from specdec.algorithms.rejection import RejectionSampler, _residual
from specdec.algorithms.verify import Verdict, VerifyInputs, commit

V = 4
K = 3
T = 0.8
TRIALS = 20_000
# chi2.ppf(1 - 0.001, dof = V * V - 1 = 15) = 37.697; scipy is not a dependency of specdec,
# so the value is hard-coded (and checked against scipy below when it is installed).
CHI2_CRIT_15_DOF_P001 = 37.697

# Target logits for absolute positions 0..4 (a round starting at 1 reads rows 1..4).
TARGET = torch.tensor(
    [
        [1.0, 0.2, -0.5, 0.6],
        [-0.3, 0.9, 0.4, 0.0],
        [0.5, 0.5, -1.0, 0.2],
        [0.0, -0.4, 0.8, 0.3],
        [0.3, 0.1, 0.0, -0.2],
    ],
    dtype=torch.float64,
)
# Drafter proposals for positions 0..4: deliberately different from the target (some q > p,
# some q < p), so that rejections and the residual both matter.
PROPOSAL = torch.tensor(
    [
        [0.10, 0.50, 0.30, 0.10],
        [0.40, 0.10, 0.10, 0.40],
        [0.25, 0.25, 0.25, 0.25],
        [0.70, 0.10, 0.10, 0.10],
        [0.25, 0.25, 0.25, 0.25],
    ],
    dtype=torch.float64,
)


@pytest.fixture(autouse=True)
def one_thread():
    """Run these tiny-tensor loops on one CPU thread; thread hand-offs would dominate otherwise."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def target_probs(position: int) -> list[float]:
    """p_j = softmax(z_j / T), computed independently of torch."""
    weights = [math.exp(z / T) for z in TARGET[position].tolist()]
    return [w / sum(weights) for w in weights]


def first_two_tokens(
    verifier, proposal: torch.Tensor, drafts: dict[int, torch.Tensor], gen: torch.Generator
) -> tuple[int, int]:
    """One simulated generation: rounds of K drafts until at least two tokens are committed.

    drafts[j]: [K] the draft for a round starting at absolute position j, sampled from
    proposal[j : j + K] independently of everything else.
    """
    committed: list[int] = []
    while len(committed) < 2:
        j = len(committed)
        verdict = verifier.verify(
            None, VerifyInputs(TARGET[j : j + K + 1], drafts[j], proposal[j : j + K], gen)
        )
        committed += verdict.tokens
    return committed[0], committed[1]


def sample_drafts(proposal: torch.Tensor, trials: int, gen: torch.Generator) -> dict[int, list]:
    """For each round start j in {0, 1}: `trials` independent drafts [K] from proposal[j : j+K]."""
    drafts = {}
    for j in (0, 1):
        tokens = torch.multinomial(proposal[j : j + K], trials, replacement=True, generator=gen)
        drafts[j] = list(tokens.T)  # trials x [K]; sampled up front, only for speed
    return drafts


def pair_counts(verifier, proposal: torch.Tensor, trials: int, seed: int) -> list[list[int]]:
    """counts[t0][t1]: how often the first two committed tokens were (t0, t1) over ``trials``."""
    gen = torch.Generator().manual_seed(seed)
    drafts = sample_drafts(proposal, trials, gen)
    counts = [[0] * V for _ in range(V)]
    for t in range(trials):
        t0, t1 = first_two_tokens(verifier, proposal, {0: drafts[0][t], 1: drafts[1][t]}, gen)
        counts[t0][t1] += 1
    return counts


def chi_square(verifier, proposal: torch.Tensor, trials: int = TRIALS, seed: int = 1234) -> float:
    """Pearson chi-square of the (t0, t1) counts against trials * p_0(t0) * p_1(t1); 15 dof."""
    counts = pair_counts(verifier, proposal, trials, seed)
    p0, p1 = target_probs(0), target_probs(1)
    expected = [[trials * p0[a] * p1[b] for b in range(V)] for a in range(V)]
    assert min(min(row) for row in expected) >= 5  # the chi-square approximation holds
    return sum(
        (counts[a][b] - expected[a][b]) ** 2 / expected[a][b] for a in range(V) for b in range(V)
    )


class AcceptEverything:
    """A deliberately wrong sampler: keeps every draft token, then samples a bonus from p_K."""

    def new_state(self):
        return None

    def verify(self, state, inputs: VerifyInputs) -> Verdict:
        logits, draft, generator = inputs.logits, inputs.draft, inputs.generator
        p_last = torch.softmax(logits[-1] / T, dim=-1)
        bonus = int(torch.multinomial(p_last, 1, generator=generator))
        return Verdict(accepted=draft.shape[0], tokens=commit(draft, draft.shape[0], bonus))


def test_committed_tokens_follow_the_target_distribution():
    assert chi_square(RejectionSampler(temperature=T), PROPOSAL) < CHI2_CRIT_15_DOF_P001


def test_deterministic_drafter_with_one_hot_rows_is_lossless():
    # Fewer trials for time: a one-hot drafter is rejected often, so most trials take 2 rounds.
    one_hot = torch.nn.functional.one_hot(torch.tensor([1, 3, 0, 2, 1]), V).double()
    assert (
        chi_square(RejectionSampler(temperature=T), one_hot, trials=10_000) < CHI2_CRIT_15_DOF_P001
    )


def test_negative_control_a_wrong_sampler_fails_the_same_test():
    assert chi_square(AcceptEverything(), PROPOSAL) > CHI2_CRIT_15_DOF_P001


def test_negative_control_resampling_from_p_instead_of_the_residual_fails(monkeypatch):
    # The classic bug: after a rejection, sample from p_i rather than norm(max(0, p_i - q_i)).
    monkeypatch.setattr(rejection, "_residual", lambda p, q: p)
    assert (
        chi_square(RejectionSampler(temperature=T), PROPOSAL, trials=5_000) > CHI2_CRIT_15_DOF_P001
    )


def test_critical_value_matches_scipy():
    stats = pytest.importorskip("scipy.stats")
    assert stats.chi2.ppf(1 - 0.001, V * V - 1) == pytest.approx(CHI2_CRIT_15_DOF_P001, abs=1e-3)


def test_one_hot_draft_rejected_when_the_target_forbids_it():
    logits = torch.tensor([[0.0, -math.inf, 0.0, 0.0], [0.0, 0.0, 0.0, 0.0]])
    q = torch.tensor([[0.0, 1.0, 0.0, 0.0]])
    gen = torch.Generator().manual_seed(0)
    for _ in range(200):
        verdict = RejectionSampler(1.0).verify(None, VerifyInputs(logits, torch.tensor([1]), q, gen))
        assert verdict.accepted == 0
        assert verdict.tokens[0] != 1  # recovered from max(0, p - q), which excludes token 1


def test_one_hot_draft_accepted_when_the_target_is_certain():
    logits = torch.full((3, V), -1e4)
    logits[0, 2] = logits[1, 0] = logits[2, 3] = 0.0  # p_i is (numerically) one-hot
    q = torch.nn.functional.one_hot(torch.tensor([2, 0]), V).double()
    verdict = RejectionSampler(1.0).verify(
        None, VerifyInputs(logits, torch.tensor([2, 0]), q, torch.Generator().manual_seed(0))
    )
    assert verdict == Verdict(accepted=2, tokens=[2, 0, 3])


def test_same_seed_same_output():
    def run(seed: int) -> list[Verdict]:
        gen = torch.Generator().manual_seed(seed)
        sampler = RejectionSampler(temperature=T)
        return [
            sampler.verify(None, VerifyInputs(TARGET[:4], torch.tensor([1, 0, 2]), PROPOSAL[:3], gen))
            for _ in range(50)
        ]

    assert run(7) == run(7)
    assert run(7) != run(8)


def test_empty_draft_samples_from_the_target_without_draft_probs():
    verdict = RejectionSampler(1.0).verify(None, VerifyInputs(
        TARGET[:1], torch.tensor([], dtype=torch.long), generator=torch.Generator().manual_seed(0)
    ))
    assert verdict.accepted == 0 and 0 <= verdict.tokens[0] < V


def test_missing_or_misshapen_draft_probs_raise():
    sampler = RejectionSampler(1.0)
    with pytest.raises(ValueError, match="draft_probs"):
        sampler.verify(None, VerifyInputs(TARGET[:3], torch.tensor([0, 1])))
    with pytest.raises(ValueError, match="draft_probs must be"):
        sampler.verify(None, VerifyInputs(TARGET[:3], torch.tensor([0, 1]), PROPOSAL[:3]))
    zero = torch.tensor([[0.0, 1.0, 0.0, 0.0]])
    with pytest.raises(ValueError, match="probability 0"):
        sampler.verify(None, VerifyInputs(TARGET[:2], torch.tensor([0]), zero))


@pytest.mark.parametrize("temperature", [0.0, -1.0, math.nan, math.inf])
def test_bad_temperature_raises(temperature):
    with pytest.raises(ValueError, match="temperature"):
        RejectionSampler(temperature=temperature)


def test_empty_residual_falls_back_to_the_target():
    p = torch.tensor([0.1, 0.2, 0.3, 0.4], dtype=torch.float64)
    assert torch.equal(_residual(p, p.clone()), p)
    q = torch.tensor([0.4, 0.2, 0.3, 0.1], dtype=torch.float64)
    assert torch.allclose(_residual(p, q), torch.tensor([0.0, 0.0, 0.0, 1.0], dtype=torch.float64))


# ---- top-k / top-p / min-p: lossless with respect to the warped target ------------------------
# chi2.ppf(1 - 0.001, dof), for the dof a warped grid can have (checked against scipy below).
CHI2_CRIT_P001 = {3: 16.266, 4: 18.467, 5: 20.515, 6: 22.458, 7: 24.322, 8: 26.124, 9: 27.877,
                  10: 29.588, 11: 31.264, 12: 32.909, 13: 34.528, 14: 36.123, 15: 37.697}
WARPED = [dict(top_k=3), dict(top_p=0.75), dict(min_p=0.45), dict(top_k=3, top_p=0.9, min_p=0.3)]


def warped_chi_square(verifier, w, proposal, trials: int = 5_000, seed: int = 99):
    """(statistic, dof) of the (t0, t1) counts against the warped target's p_0(t0) * p_1(t1);
    the statistic is inf when a token the warped target excludes was ever committed."""
    from specdec.algorithms.sampling import warp_reference

    counts = pair_counts(verifier, proposal, trials, seed)
    p0, p1 = (warp_reference(TARGET[j].tolist(), w) for j in (0, 1))
    cells = [(a, b) for a in range(V) for b in range(V)]
    if any(counts[a][b] and p0[a] * p1[b] == 0 for a, b in cells):
        return math.inf, 0
    live = [(a, b) for a, b in cells if p0[a] * p1[b] > 0]
    expected = {c: trials * p0[c[0]] * p1[c[1]] for c in live}
    assert min(expected.values()) >= 5  # the chi-square approximation holds
    return sum((counts[a][b] - expected[a, b]) ** 2 / expected[a, b] for a, b in live), len(live) - 1


@pytest.mark.parametrize("settings", WARPED)
def test_warped_sampling_follows_the_warped_target(settings):
    from specdec.algorithms.sampling import Warp

    w = Warp(T, **settings)
    stat, dof = warped_chi_square(RejectionSampler(T, **settings), w, PROPOSAL)
    assert 3 <= dof < 15  # the warp did truncate something
    assert stat < CHI2_CRIT_P001[dof]


def test_negative_control_the_unwarped_sampler_fails_the_warped_test():
    from specdec.algorithms.sampling import Warp

    stat, _ = warped_chi_square(RejectionSampler(T), Warp(T, top_k=3), PROPOSAL, trials=2_000)
    assert stat == math.inf


def test_warped_critical_values_match_scipy():
    stats = pytest.importorskip("scipy.stats")
    for dof, crit in CHI2_CRIT_P001.items():
        assert stats.chi2.ppf(1 - 0.001, dof) == pytest.approx(crit, abs=1e-3)
