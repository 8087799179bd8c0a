from __future__ import annotations

import pytest

from specdec.algorithms.sampling import GREEDY, Sampling
from specdec.models.ngram import NgramDrafter, find_match


def test_find_match_prefers_the_longest_then_the_most_recent_ngram():
    seq = [1, 2, 3, 9, 1, 2, 4, 7, 1, 2]
    m = find_match(seq, max_ngram=3, min_ngram=1)
    assert (m.ngram, m.start, m.count) == (2, 6, 2)  # "1 2" last seen at index 4, followed by 4
    assert find_match([1, 2, 3], 3, 1) is None
    assert find_match([5, 5], 3, 1).start == 1


def test_propose_continues_the_draft_block_by_block():
    d = NgramDrafter(vocab_size=10, max_ngram=2)
    state = d.start([1, 2, 3, 4, 5, 1, 2], None)
    first = d.propose(state, 2, GREEDY)
    assert first.tokens.tolist() == [3, 4]
    assert first.hidden.shape == (2, 4)
    second = d.propose(state, 2, GREEDY)
    assert second.tokens.tolist() == [5, 1]
    d.commit(state, [3, 7], None)
    assert state.committed[-2:] == [3, 7] and state.draft == []


def test_sampling_gives_one_hot_proposals():
    d = NgramDrafter(vocab_size=6)
    block = d.propose(d.start([1, 2, 1], None), 3, Sampling(temperature=1.0))
    assert block.probs.shape == (len(block), 6)
    assert block.probs.sum(-1).eq(1).all()


def test_bad_ngram_bounds():
    with pytest.raises(ValueError):
        NgramDrafter(10, max_ngram=1, min_ngram=2)
