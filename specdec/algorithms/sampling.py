"""Token choice for drafters: greedy at temperature 0, else a sample from softmax(z / T).

The proposal distribution is returned with each choice, because rejection sampling needs it;
greedy choices return none. Randomness comes only from the caller's ``torch.Generator``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Sampling:
    temperature: float = 0.0  # 0 means greedy
    generator: torch.Generator | None = None

    def __post_init__(self):
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


GREEDY = Sampling()


def choose(logits: torch.Tensor, sampling: Sampling) -> tuple[torch.Tensor, torch.Tensor | None]:
    """logits: [n, V] -> tokens [n] and, when sampling, the proposal probabilities [n, V].
    Results are on the CPU, where the caller's generator lives."""
    logits = logits.cpu()
    if sampling.greedy:
        return logits.argmax(dim=-1), None
    probs = torch.softmax(logits.double() / sampling.temperature, dim=-1)
    tokens = torch.multinomial(probs, 1, generator=sampling.generator).squeeze(-1)
    return tokens, probs
