"""Strict greedy verification, the Verdict boundary type and the verifier registry."""

from __future__ import annotations

import pytest
import torch

from specdec.algorithms.asd import AsdVerifier
from specdec.algorithms.rejection import RejectionSampler
from specdec.algorithms.verdict import greedy_tokens
from specdec.algorithms.verify import (
    StrictVerifier,
    Verdict,
    Verifier,
    VerifyInputs,
    make_verifier,
    verifier_names,
)
from tests.device_guard import GuardedCuda

V = 5


def greedy_logits(best: list[int]) -> torch.Tensor:
    """[len(best), V] logits whose row i has its (unique) maximum at best[i]."""
    logits = torch.zeros(len(best), V)
    for i, token in enumerate(best):
        logits[i, token] = 3.0
    return logits


def strict(best: list[int], draft: list[int]) -> Verdict:
    return StrictVerifier().verify(None, VerifyInputs(greedy_logits(best),
                                                  torch.tensor(draft, dtype=torch.long)))


def test_full_accept_commits_k_plus_one_tokens():
    verdict = strict([1, 2, 3, 4], [1, 2, 3])
    assert verdict == Verdict(accepted=3, tokens=[1, 2, 3, 4])


def test_reject_at_first_position_commits_only_the_correction():
    verdict = strict([1, 2, 3, 4], [0, 2, 3])
    assert verdict == Verdict(accepted=0, tokens=[1])


def test_reject_in_the_middle_stops_even_if_later_tokens_match():
    verdict = strict([1, 2, 3, 4], [1, 0, 3])
    assert verdict == Verdict(accepted=1, tokens=[1, 2])


def test_empty_draft_is_a_plain_greedy_step():
    verdict = strict([4], [])
    assert verdict == Verdict(accepted=0, tokens=[4])


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
def test_argmax_picks_the_first_maximum_on_ties(dtype):
    row = torch.tensor([0.0, 2.0, 1.0, 2.0, 2.0], dtype=dtype)
    assert int(row.argmax()) == 1
    logits = torch.stack([row, row])  # [2, V]: K = 1
    assert StrictVerifier().verify(None, VerifyInputs(logits, torch.tensor([1]))).tokens == [1, 1]
    assert StrictVerifier().verify(None, VerifyInputs(logits, torch.tensor([3]))) == Verdict(0, [1])


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
def test_greedy_tokens_equal_argmax_with_ties(dtype):
    """The verifiers' fast greedy choice is argmax's, first maximum included, on wide rows with
    many ties (a handful of values over 49152 logits), strided views too."""
    gen = torch.Generator().manual_seed(0)
    for rows in (1, 5, 24):
        tied = torch.randint(0, 4, (rows, 49152), generator=gen).to(dtype)
        spread = torch.randn(rows, 49152, generator=gen).to(dtype)
        for logits in (tied, spread, tied[:, ::3], tied.t().contiguous().t()):
            assert torch.equal(greedy_tokens(logits), logits.argmax(dim=-1))


def test_strict_equals_plain_greedy_decoding_on_random_logits():
    gen = torch.Generator().manual_seed(0)
    for _ in range(50):
        logits = torch.randint(-2, 3, (7, V), generator=gen).float()  # ties are common
        greedy = logits.argmax(dim=-1)
        draft = torch.where(
            torch.rand(6, generator=gen) < 0.7, greedy[:6], torch.randint(0, V, (6,), generator=gen)
        )
        verdict = StrictVerifier().verify(None, VerifyInputs(logits, draft))
        assert verdict.tokens == greedy[: verdict.accepted + 1].tolist()


def test_shape_errors():
    with pytest.raises(ValueError, match="K\\+1"):
        StrictVerifier().verify(None, VerifyInputs(torch.zeros(3, V), torch.tensor([0])))
    with pytest.raises(ValueError, match="integer"):
        StrictVerifier().verify(None, VerifyInputs(torch.zeros(2, V), torch.tensor([0.0])))
    with pytest.raises(ValueError, match="token ids"):
        StrictVerifier().verify(None, VerifyInputs(torch.zeros(2, V), torch.tensor([V])))


def test_verdict_checks_its_token_count():
    with pytest.raises(ValueError, match="accepted \\+ 1"):
        Verdict(accepted=2, tokens=[1, 2])


def test_make_verifier_builds_each_name():
    assert verifier_names() == ["asd", "sample", "strict"]
    assert isinstance(make_verifier("strict"), StrictVerifier)
    asd = make_verifier("asd", budget=8.0, gate=0.25, max_exceptions=2)
    assert asd == AsdVerifier(budget=8.0, gate=0.25, max_exceptions=2)
    assert make_verifier("sample", temperature=0.7) == RejectionSampler(temperature=0.7)
    for name in verifier_names():
        assert isinstance(make_verifier(name), Verifier)


def test_lossless_flags():
    assert make_verifier("strict").lossless
    assert make_verifier("sample").lossless
    assert not make_verifier("asd", budget=8.0).lossless
    assert make_verifier("asd", budget=0.0).lossless


def test_make_verifier_unknown_name_lists_known_names():
    with pytest.raises(ValueError, match="unknown verifier 'typical'.*asd, sample, strict"):
        make_verifier("typical")


def test_make_verifier_bad_parameters():
    with pytest.raises(ValueError, match="bad parameters for verifier 'strict'"):
        make_verifier("strict", budget=1.0)
    with pytest.raises(ValueError, match="gate"):
        make_verifier("asd", gate=-1.0)


@pytest.mark.parametrize("verifier", [StrictVerifier(), AsdVerifier(budget=4.0, gate=1.0),
                                      RejectionSampler(temperature=1.0)], ids=type)
def test_verifiers_run_on_the_gpu_as_on_the_cpu(verifier):
    """On the stand-in GPU (tests.device_guard) no op mixes devices; the verdict is the CPU's."""
    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(5, V, generator=gen, dtype=torch.float64)
    draft = torch.tensor([1, 2, 3, 4])
    probs = torch.softmax(torch.randn(4, V, generator=gen, dtype=torch.float64), -1)  # on the CPU

    def verdict(move) -> Verdict:
        torch.manual_seed(0)  # the sampler's draws without a generator
        inputs = VerifyInputs(move(logits), move(draft), probs)
        return verifier.verify(verifier.new_state(), inputs)

    cpu = verdict(lambda t: t)
    with GuardedCuda():
        assert verdict(lambda t: t.cuda()) == cpu


def test_a_round_on_two_devices_is_refused_naming_the_field():
    with GuardedCuda():
        logits = torch.zeros(3, V).cuda()
        with pytest.raises(ValueError, match="draft on cpu, logits on cuda"):
            VerifyInputs(logits, torch.tensor([1, 2]))
        with pytest.raises(ValueError, match="generator on cpu, logits on cuda"):
            VerifyInputs(logits, torch.tensor([1, 2]).cuda(), generator=torch.Generator())
