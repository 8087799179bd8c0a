"""N-gram prompt lookup: a drafter with no model (Saxena 2023; HF ``prompt_lookup_num_tokens``).

It finds the most recent earlier occurrence of the sequence's last n tokens (n from
``max_ngram`` down to ``min_ngram``) and proposes the tokens that followed it. It pays off where
outputs copy their context: code edits, summaries, quoted names.

Its "hidden state" for PACER is four hand-made features per drafted token: the matched n-gram
length (normalised), how often the n-gram occurs (capped), the token's offset in the copied
span (scaled), and a constant 1.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from specdec.algorithms.sampling import Sampling
from specdec.models.drafter import DraftBlock

FEATURES = 4


@dataclass
class NgramState:
    committed: list[int]
    draft: list[int] = field(default_factory=list)


@dataclass(frozen=True)
class Match:
    start: int  # index in the sequence of the first token to copy
    ngram: int  # length of the matched n-gram
    count: int  # occurrences of that n-gram before the end


def find_match(seq: list[int], max_ngram: int, min_ngram: int) -> Match | None:
    """The most recent earlier occurrence of seq's longest matching suffix n-gram."""
    for n in range(min(max_ngram, len(seq) - 1), min_ngram - 1, -1):
        suffix = seq[-n:]
        hits = [i for i in range(len(seq) - n - 1, -1, -1) if seq[i:i + n] == suffix]
        if hits:
            return Match(start=hits[0] + n, ngram=n, count=len(hits))
    return None


class NgramDrafter:
    needs_target_features = False
    max_draft_len = None
    hidden_size = FEATURES

    def __init__(self, vocab_size: int, max_ngram: int = 3, min_ngram: int = 1):
        if not 1 <= min_ngram <= max_ngram:
            raise ValueError(f"need 1 <= min_ngram <= max_ngram, got {min_ngram}, {max_ngram}")
        self.vocab_size = vocab_size
        self.max_ngram, self.min_ngram = max_ngram, min_ngram

    def start(self, prompt_ids: list[int], features=None) -> NgramState:
        return NgramState(committed=list(prompt_ids))

    def propose(self, state: NgramState, n: int, sampling: Sampling) -> DraftBlock:
        seq = state.committed + state.draft
        match = find_match(seq, self.max_ngram, self.min_ngram)
        if match is None or n < 1:
            return DraftBlock.empty(FEATURES)
        copied = seq[match.start:match.start + n]
        state.draft.extend(copied)
        hidden = torch.tensor([
            [match.ngram / self.max_ngram, min(match.count, 4) / 4, i / 8, 1.0]
            for i in range(len(copied))
        ])
        tokens = torch.tensor(copied, dtype=torch.long)
        probs = None
        if not sampling.greedy:  # a deterministic proposal: one-hot distributions
            probs = torch.nn.functional.one_hot(tokens, self.vocab_size).double()
        return DraftBlock(tokens, hidden, probs)

    def commit(self, state: NgramState, tokens: list[int], features=None) -> None:
        state.committed.extend(tokens)
        state.draft = []
