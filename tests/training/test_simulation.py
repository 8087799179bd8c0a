import torch

from specdec.algorithms.verify import make_verifier
from specdec.training.simulation import simulate_request
from tests.conftest import greedy_reference


def test_records_are_consistent_with_strict_verification(pair64):
    target, drafter = pair64.target, pair64.drafter
    prompt = list(b"def f(x):\n    return")
    records = simulate_request(target, drafter, make_verifier("strict"), prompt, 24,
                               draft_len=drafter.max_draft_len, pacer_block=3)
    assert records and all(len(r.hidden) == drafter.hidden_size for r in records)
    for r in records:
        assert r.block == r.position // 3 and r.regret >= 0
        if r.accepted:
            assert r.token == r.greedy and r.regret == 0
    # accepted labels form a prefix of each step
    by_step: dict[int, list[int]] = {}
    for r in records:
        by_step.setdefault(r.step, []).append(r.accepted)
    assert all(labels == sorted(labels, reverse=True) for labels in by_step.values())
    # the greedy tokens of accepted positions and the bonuses rebuild greedy decoding
    ref = greedy_reference(target.model, prompt, 8, target.eos_token_ids)
    first = [r for r in records if r.step == 0]
    assert first[0].greedy == ref[0]
    assert torch.is_tensor(torch.tensor([r.regret for r in records]))
