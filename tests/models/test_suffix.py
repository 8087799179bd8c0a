"""The suffix drafter: recorded drafts, budgets, the global tree online (insertion, FIFO
eviction, the index first), the index file format and its errors, and sampling losslessness."""

from __future__ import annotations

import json

import pytest
import torch

from specdec.algorithms.rejection import RejectionSampler
from specdec.algorithms.sampling import Sampling
from specdec.algorithms.verdict import VerifyInputs
from specdec.engine.settings import SpecSettings
from specdec.models.suffix import SuffixConfig, SuffixDrafter
from specdec.models.suffix_index import CONFIG_FILE, TOKENS_FILE, SuffixIndex
from tests.algorithms.test_rejection import CHI2_CRIT_15_DOF_P001, TARGET, T, V, target_probs

GREEDY = Sampling(0.0, None)
LOOSE = SpecSettings(max_draft=8, suffix_factor=4.0, suffix_min_prob=0.0)


def draft(drafter, state, n=16) -> list[int]:
    return drafter.propose(state, n, GREEDY).tokens.tolist()


def test_recorded_draft_from_the_local_tree():
    # prompt 1 2 3 4 1 2: "1 2" occurs twice, once followed by 3 and once at the end, so the
    # walk from it goes 3 (1/2), then 4, 1, 2 (each 1/1): path probabilities 0.5 throughout
    drafter = SuffixDrafter(10, SuffixConfig(max_depth=8))
    state = drafter.start([1, 2, 3, 4, 1, 2], None, LOOSE)
    block = drafter.propose(state, 8, GREEDY)
    assert block.tokens.tolist() == [3, 4, 1, 2]
    assert block.hidden[:, 0].tolist() == [0.5] * 4  # path probabilities
    assert drafter.speculate(state).score == 2.0 and state.draft.match_len == 2


def test_propose_hands_out_one_speculation_piece_by_piece():
    drafter = SuffixDrafter(10)
    state = drafter.start([5, 6, 7, 8, 9, 5, 6], None, LOOSE)
    first, second = draft(drafter, state, 1), draft(drafter, state, 2)
    assert first + second == [7, 8, 9]
    assert state.source == "suffix"
    drafter.commit(state, [7, 8])
    assert state.source is None and state.draft is None


def test_budget_is_min_of_max_draft_and_factor_times_match():
    drafter = SuffixDrafter(10)
    seq = list(range(10)) * 2  # after 0 1 2: 3 4 5 ... every count 1
    for factor, offset, max_draft, want in ((1.0, 0.0, 16, 3), (1.0, 2.0, 16, 5), (4.0, 0.0, 4, 4)):
        spec = SpecSettings(max_draft=max_draft, suffix_factor=factor, suffix_offset=offset,
                            suffix_min_prob=0.0)
        state = drafter.start(seq[:13], None, spec)  # context ends 0 1 2: match length 3
        assert draft(drafter, state) == seq[13:13 + want], (factor, offset, max_draft)
        drafter.finish(state)


def test_min_token_prob_stops_the_walk():
    drafter = SuffixDrafter(10)
    # match "1 2" (3 times: then 3, 3, the end): 3 at 2/3, then 4 at 2/3 * 1/2 = 1/3, ...;
    # match "0 1 2" (twice: then 3, the end): 3 at 1/2, then 5 0 1 2 at 1/2 each
    prompt = [1, 2, 3, 4, 0, 1, 2, 3, 5, 0, 1, 2]

    def with_min(p: float) -> list[int]:
        return draft(drafter, drafter.start(prompt, None, SpecSettings(suffix_min_prob=p,
                                                                       suffix_factor=4.0)))

    assert with_min(0.3) == [3, 4, 0, 1, 2, 3, 5, 0]  # budget 4 * 2; score 2.67 beats 2.5
    assert with_min(0.5) == [3, 5, 0, 1, 2]  # "1 2" stops after 3 (score 0.67): "0 1 2" wins
    assert with_min(0.7) == []


def test_finished_outputs_enter_the_global_tree():
    drafter = SuffixDrafter(20)
    first = drafter.start([1, 2], None, LOOSE)
    drafter.commit(first, [10, 11, 12, 13, 14])
    drafter.finish(first)
    other = drafter.start([3, 10, 11], None, LOOSE)  # nothing after "10 11" in its own prompt
    assert draft(drafter, other) == [12, 13, 14]
    assert drafter.cached_responses == 2  # the first response and the one just started


def test_cold_drafter_forgets_served_outputs():
    drafter = SuffixDrafter(20, SuffixConfig(online=False))
    first = drafter.start([1, 2], None, LOOSE)
    drafter.commit(first, [10, 11, 12, 13, 14])
    drafter.finish(first)
    assert draft(drafter, drafter.start([3, 10, 11], None, LOOSE)) == []


def test_global_tree_evicts_oldest_first_index_included():
    index = SuffixIndex(((10, 11, 12, 13),), "t", 30)
    drafter = SuffixDrafter(30, SuffixConfig(max_cached_requests=2), index)
    probe = drafter.start([7, 10, 11], None, LOOSE)  # takes the second slot
    assert draft(drafter, probe) == [12, 13]  # from the index
    drafter.finish(probe)
    a = drafter.start([1], None, LOOSE)  # a third response: the index's sequence goes first
    drafter.commit(a, [20, 21, 22, 23])
    drafter.finish(a)
    assert drafter.cached_responses == 2
    fresh = drafter.start([8, 10, 11], None, LOOSE)  # pushes out the probe's (empty) response
    assert draft(drafter, fresh) == []  # the index's sequence was evicted
    drafter.commit(fresh, [20, 21])
    assert draft(drafter, fresh) == [22, 23]  # a's response is still there


def test_index_round_trip_and_seeding(tmp_path):
    index = SuffixIndex(((1, 2, 3), (4, 5, 6, 7)), "tiny", 50, {"source": "x.parquet"})
    loaded = SuffixIndex.load(index.save(tmp_path / "idx"))
    assert loaded == index and loaded.num_tokens == 7
    drafter = SuffixDrafter(50, SuffixConfig(index=str(tmp_path / "idx")))
    drafter = SuffixDrafter.load(50, SuffixConfig(index=str(tmp_path / "idx")))
    assert draft(drafter, drafter.start([9, 4, 5], None, LOOSE)) == [6, 7]


def test_index_for_another_vocabulary_is_refused(tmp_path):
    SuffixIndex(((1, 2),), "other", 100).save(tmp_path / "idx")
    with pytest.raises(ValueError, match="vocabulary 100 .* does not match the target's 50"):
        SuffixDrafter.load(50, SuffixConfig(index=str(tmp_path / "idx")))


def corrupt(path, how: str) -> None:
    from safetensors.torch import save_file

    if how == "no-config":
        (path / CONFIG_FILE).unlink()
    elif how == "bad-json":
        (path / CONFIG_FILE).write_text("{not json")
    elif how == "wrong-format":
        (path / CONFIG_FILE).write_text(json.dumps({"format": 99}))
    elif how == "no-tokens":
        (path / TOKENS_FILE).unlink()
    elif how == "not-safetensors":
        (path / TOKENS_FILE).write_bytes(b"garbage" * 10)
    elif how == "count-mismatch":
        save_file({"tokens": torch.tensor([1, 2], dtype=torch.int32),
                   "offsets": torch.tensor([0, 2])}, str(path / TOKENS_FILE))
    elif how == "out-of-vocab":
        save_file({"tokens": torch.tensor([1, 99, 3, 4], dtype=torch.int32),
                   "offsets": torch.tensor([0, 2, 4])}, str(path / TOKENS_FILE))


@pytest.mark.parametrize("how,match", [
    ("no-config", "has no suffix_index.json"), ("bad-json", "not valid JSON"),
    ("wrong-format", "expected format 1"), ("no-tokens", "has no tokens.safetensors"),
    ("not-safetensors", "not a safetensors file"), ("count-mismatch", "config says 2|says 2"),
    ("out-of-vocab", "outside the vocabulary"),
])
def test_malformed_index_fails_clearly(tmp_path, how, match):
    path = SuffixIndex(((1, 2), (3, 4)), "tiny", 50).save(tmp_path / "idx")
    corrupt(path, how)
    with pytest.raises((ValueError, FileNotFoundError), match=match):
        SuffixIndex.load(path)


def test_missing_index_fails_clearly(tmp_path):
    with pytest.raises(FileNotFoundError, match="is not a directory"):
        SuffixIndex.load(tmp_path / "nowhere")
    with pytest.raises(FileNotFoundError, match="cannot resolve models:/nope@champion"):
        SuffixIndex.load("models:/nope@champion")


def test_sampling_with_suffix_drafts_is_lossless():
    """Rejection sampling over the suffix drafter's one-hot proposals: the first two committed
    tokens follow p_0 * p_1 (chi-square, as tests/algorithms/test_rejection.py)."""
    torch.set_num_threads(1)
    index = SuffixIndex(((1, 3, 0, 2), (1, 3, 2, 2), (0, 1, 3)), "toy", V)
    drafter = SuffixDrafter(V, SuffixConfig(online=False), index)
    sampler, gen, trials = RejectionSampler(temperature=T), torch.Generator().manual_seed(7), 8000
    sampling = Sampling(T, torch.Generator().manual_seed(8))
    counts = [[0] * V for _ in range(V)]
    drafted = 0
    for _ in range(trials):
        state = drafter.start([2, 0, 1], None, LOOSE)
        committed: list[int] = []
        while len(committed) < 2:
            j = len(committed)
            block = drafter.propose(state, 3, sampling)
            drafted += len(block)
            probs = block.probs if len(block) else None
            verdict = sampler.verify(None, VerifyInputs(TARGET[j:j + len(block) + 1], block.tokens,
                                                     probs, gen))
            drafter.commit(state, verdict.tokens)
            committed += verdict.tokens
        drafter.finish(state)
        counts[committed[0]][committed[1]] += 1
    assert drafted > trials  # the suffix drafter did propose
    p0, p1 = target_probs(0), target_probs(1)
    chi2 = sum((counts[a][b] - trials * p0[a] * p1[b]) ** 2 / (trials * p0[a] * p1[b])
               for a in range(V) for b in range(V))
    assert chi2 < CHI2_CRIT_15_DOF_P001
