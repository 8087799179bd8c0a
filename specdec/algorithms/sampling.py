"""Token choice for drafters, and the warped distributions both sides of a round sample from.

What this module is: ``Warp`` (temperature, top-k, top-p, min-p: the sampling settings of a
request), ``warp`` (logits -> the warped distribution, vectorised) beside its slow readable
reference ``warp_reference``, and ``choose`` (greedy at temperature 0, else a sample from the
warped distribution). What it is not: no verification (``rejection.py`` draws against the same
warped target), no model calls.

Terms, defined once:

* warped distribution -- ``p = softmax(z / T)``, then truncated and renormalised: keep the
  ``top_k`` most likely tokens (0 or -1: all), then the smallest most-likely set of the
  remainder whose mass reaches ``top_p`` (the nucleus; the most likely token is always kept),
  then the tokens with ``p >= min_p * max(p)``. Ties are broken by token id (a stable sort), so
  the kept set is deterministic.

The proposal distribution is returned with each sampled choice, because rejection sampling
needs it; greedy choices return none (top-k, top-p and min-p never remove the argmax, so
greedy decoding is unchanged by them). Randomness comes only from the caller's
``torch.Generator``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from specdec.algorithms.verdict import greedy_tokens


@dataclass(frozen=True)
class Warp:
    temperature: float = 0.0  # 0 means greedy
    top_k: int = 0  # 0 or -1: no top-k truncation
    top_p: float = 1.0  # 1: no nucleus truncation
    min_p: float = 0.0  # 0: no min-p truncation

    def __post_init__(self):
        checks = [
            (self.temperature >= 0 and math.isfinite(self.temperature),
             f"temperature must be finite and >= 0, got {self.temperature}"),
            (self.top_k >= -1, f"top_k must be >= -1 (0 or -1: off), got {self.top_k}"),
            (0 < self.top_p <= 1, f"top_p must be in (0, 1], got {self.top_p}"),
            (0 <= self.min_p <= 1, f"min_p must be in [0, 1], got {self.min_p}"),
        ]
        for ok, message in checks:
            if not ok:
                raise ValueError(message)

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    @property
    def truncates(self) -> bool:
        return self.top_k > 0 or self.top_p < 1 or self.min_p > 0


def warp(logits: torch.Tensor, w: Warp) -> torch.Tensor:
    """logits [n, V] -> the warped distribution [n, V] (float64) at temperature w.temperature > 0."""
    probs = torch.softmax(logits.double() / w.temperature, dim=-1)  # [n, V]
    if not w.truncates:
        return probs
    sorted_p, order = probs.sort(dim=-1, descending=True, stable=True)  # [n, V] each
    rank = torch.arange(probs.shape[-1], device=probs.device)  # [V]
    keep = torch.ones_like(sorted_p, dtype=torch.bool)  # [n, V] in sorted order
    if w.top_k > 0:
        keep &= rank < w.top_k
    if w.top_p < 1:
        kept = sorted_p * keep
        kept = kept / kept.sum(dim=-1, keepdim=True)
        before = kept.cumsum(dim=-1) - kept  # [n, V] mass strictly before each rank
        keep &= before < w.top_p
    if w.min_p > 0:
        keep &= sorted_p >= w.min_p * sorted_p[:, :1]
    mask = torch.zeros_like(keep).scatter(-1, order, keep)  # back to token order
    truncated = probs * mask
    return truncated / truncated.sum(dim=-1, keepdim=True)


def warp_reference(logits: list[float], w: Warp) -> list[float]:
    """The same distribution for one row, in plain Python (the readable reference of ``warp``)."""
    weights = [math.exp((z - max(logits)) / w.temperature) for z in logits]
    p = [x / sum(weights) for x in weights]
    order = sorted(range(len(p)), key=lambda t: (-p[t], t))  # most likely first, ties by id
    kept = order[: w.top_k] if w.top_k > 0 else order
    if w.top_p < 1:
        mass, nucleus = sum(p[t] for t in kept), []
        for t in kept:
            if sum(p[u] for u in nucleus) / mass >= w.top_p:
                break
            nucleus.append(t)
        kept = nucleus
    kept = [t for t in kept if p[t] >= w.min_p * p[order[0]]]
    total = sum(p[t] for t in kept)
    return [p[t] / total if t in kept else 0.0 for t in range(len(p))]


@dataclass(frozen=True)
class Sampling:
    """A drafter's token choice: a ``Warp`` and the random stream to sample it with."""

    temperature: float = 0.0  # 0 means greedy
    generator: torch.Generator | None = None
    top_k: int = 0
    top_p: float = 1.0
    min_p: float = 0.0

    def __post_init__(self):
        self.warp  # noqa: B018 -- validates the settings

    @property
    def warp(self) -> Warp:
        return Warp(self.temperature, self.top_k, self.top_p, self.min_p)

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


GREEDY = Sampling()


def choose(logits: torch.Tensor, sampling: Sampling) -> tuple[torch.Tensor, torch.Tensor | None]:
    """logits: [n, V] -> tokens [n] and, when sampling, the proposal probabilities [n, V].
    Results are on the CPU, where the caller's generator lives."""
    logits = logits.cpu()
    if sampling.greedy:
        return greedy_tokens(logits), None
    probs = warp(logits, sampling.warp)
    tokens = torch.multinomial(probs, 1, generator=sampling.generator).squeeze(-1)
    return tokens, probs
