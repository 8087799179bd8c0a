"""Log probabilities of committed tokens, taken from the verify pass that already scored them.

What this is: ``TokenLogprobs``, the few floats per committed token that cross from the target
side to the caller when a request asks for them (never the full logits), and ``score``, which
reads them off the verify pass's logits. What it is not: no sampling, no tokenisation (the
server turns ids into strings).

Terms: row i of a round's logits [K+1, V] predicts committed token i (``tokens[i]``, an
accepted draft or the bonus), so the committed tokens' log probabilities come from rows
0..accepted with no extra pass. They are the target model's own distribution,
``log_softmax(z_i)`` on raw logits: temperature and top-k / top-p do not change them (vLLM's
default, ``raw_logprobs``).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class TokenLogprobs:
    """Per committed token: its log probability and the ``top`` most likely alternatives."""

    logprobs: list[float]  # [n] log p(token_i)
    top_ids: list[list[int]]  # [n][top] most likely tokens at position i, most likely first
    top_logprobs: list[list[float]]  # [n][top] their log probabilities

    def __post_init__(self):
        if not len(self.logprobs) == len(self.top_ids) == len(self.top_logprobs):
            raise ValueError("logprobs, top_ids and top_logprobs must have one row per token")

    def __len__(self) -> int:
        return len(self.logprobs)

    def head(self, n: int) -> TokenLogprobs:
        """The first n tokens' rows (a round truncated at EOS, a stop or the budget)."""
        return TokenLogprobs(self.logprobs[:n], self.top_ids[:n], self.top_logprobs[:n])

    @staticmethod
    def concat(parts: list[TokenLogprobs]) -> TokenLogprobs:
        return TokenLogprobs([x for p in parts for x in p.logprobs],
                             [x for p in parts for x in p.top_ids],
                             [x for p in parts for x in p.top_logprobs])


def score(logits: torch.Tensor, tokens: list[int], top: int) -> TokenLogprobs:
    """logits [>= n, V] (row i predicts tokens[i]), n = len(tokens) -> their log probabilities
    and the ``top`` best alternatives per row (ties by lowest id)."""
    logp = torch.log_softmax(logits[: len(tokens)].double(), dim=-1)  # [n, V]
    chosen = logp.gather(1, torch.tensor(tokens, dtype=torch.long)[:, None]).squeeze(1)  # [n]
    best, ids = logp.sort(dim=-1, descending=True, stable=True)  # [n, V]
    return TokenLogprobs(chosen.tolist(), ids[:, :top].tolist(), best[:, :top].tolist())
