"""Rejection-sampling verification: lossless speculative sampling at temperature T > 0.

Reference: Leviathan, Kalman, Matias, "Fast Inference from Transformers via Speculative
Decoding", ICML 2023 (also Chen et al. 2023). The committed tokens are distributed exactly as
sampling from the target at temperature T, whatever the drafter proposes.

What this module is: ``RejectionSampler``, a ``Verifier`` for sampled decoding. What it is not:
no drafting (the drafter supplies its proposal distribution ``draft_probs``), no greedy rule (see
``verify.py`` and ``asd.py``), no state across rounds (``new_state`` is None; the request's
random stream comes in ``VerifyInputs.generator``). With top-k / top-p / min-p
(``sampling.warp``) the target side is the warped target and the drafter proposes from its own
warped distribution; the argument is unchanged (it holds for any p and any q that gives each
drafted token mass > 0), so the committed tokens are distributed exactly as sampling from the
warped target.

Terms, defined once (shapes as in ``verdict.py``):

* ``p_i = warp(z_i)`` [V] -- the target distribution at position i (row i of the logits):
  softmax(z_i / T), truncated by top-k / top-p / min-p when those are set.
* ``q_i`` [V] -- the drafter's proposal distribution at draft position i (row i of draft_probs);
  a deterministic drafter passes one-hot rows.
* accepted token -- a draft token x_i kept with probability min(1, p_i(x_i) / q_i(x_i)).
* recovered token -- at the first rejection i, a replacement sampled from the residual
  norm(max(0, p_i - q_i)); it is the last token committed this round.
* bonus token -- when all K draft tokens are accepted, one more token sampled from p_K.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar

import torch

from specdec.algorithms.sampling import Warp, warp
from specdec.algorithms.verdict import Verdict, VerifyInputs, check_round, commit

__all__ = ["RejectionSampler"]

# A residual with less total mass than this is treated as empty (p == q up to rounding).
# Its mass is the rejection probability TV(p, q), so this branch is reached almost never.
_EMPTY_RESIDUAL = 1e-12


def _sample(weights: torch.Tensor, generator: torch.Generator | None) -> int:
    """One token from non-negative weights [V] (normalised by multinomial)."""
    return int(torch.multinomial(weights, 1, generator=generator))


def _residual(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """norm(max(0, p - q)) [V]; falls back to p when the residual is (numerically) empty."""
    residual = (p - q).clamp(min=0)  # [V]
    mass = float(residual.sum())
    if mass <= _EMPTY_RESIDUAL:
        return p
    return residual / mass


def _check_draft_probs(draft_probs: torch.Tensor | None, k: int, vocab: int) -> torch.Tensor:
    if draft_probs is None:
        raise ValueError(
            "rejection sampling needs draft_probs [K, V] when K > 0 "
            "(a deterministic drafter passes one-hot rows)"
        )
    if tuple(draft_probs.shape) != (k, vocab):
        raise ValueError(
            f"draft_probs must be [K, V] = [{k}, {vocab}], got {tuple(draft_probs.shape)}"
        )
    return draft_probs


def _accept_prefix(
    p: torch.Tensor, q: torch.Tensor, draft: torch.Tensor, generator: torch.Generator | None
) -> int:
    """Number of leading draft tokens accepted. p, q: [K, V]; draft: [K]."""
    idx = draft[:, None]  # [K, 1]
    p_x = p.gather(1, idx).squeeze(1)  # [K] p_i(x_i)
    q_x = q.gather(1, idx).squeeze(1)  # [K] q_i(x_i)
    if bool((q_x <= 0).any()):
        raise ValueError("draft_probs gives probability 0 to a drafted token")
    # u ~ U[0, 1): P(u * q < p) = P(u < p / q) = min(1, p / q). Draws for positions after the
    # first rejection are unused; drawing all K at once keeps this loop-free.
    u = torch.rand(p_x.shape[0], generator=generator, dtype=p.dtype, device=p.device)  # [K]
    keep = u * q_x < p_x  # [K] bool
    return int(keep.long().cumprod(dim=0).sum())


@dataclass(frozen=True)
class RejectionSampler:
    """Speculative sampling at temperature T: lossless for any drafter."""

    temperature: float = 1.0
    top_k: int = 0  # 0 or -1: off
    top_p: float = 1.0
    min_p: float = 0.0
    lossless: ClassVar[bool] = True

    def __post_init__(self):
        if not (self.temperature > 0 and math.isfinite(self.temperature)):
            raise ValueError(
                f"rejection sampling needs a finite temperature > 0 "
                f"(use the strict verifier for greedy), got {self.temperature}"
            )
        self.warp  # noqa: B018 -- validates top_k, top_p, min_p

    @property
    def warp(self) -> Warp:
        return Warp(self.temperature, self.top_k, self.top_p, self.min_p)

    def new_state(self) -> None:
        return None

    def verify(self, state: None, inputs: VerifyInputs) -> Verdict:
        logits, draft, generator = inputs.logits, inputs.draft, inputs.generator
        k = check_round(logits, draft)
        p = warp(logits, self.warp)  # [K+1, V]
        if k == 0:  # a plain sampling step: only the bonus
            return Verdict(accepted=0, tokens=[_sample(p[0], generator)])
        q = _check_draft_probs(inputs.draft_probs, k, p.shape[1]).to(p)  # [K, V]
        accepted = _accept_prefix(p[:k], q, draft, generator)
        if accepted == k:
            last = _sample(p[k], generator)  # bonus token
        else:
            last = _sample(_residual(p[accepted], q[accepted]), generator)  # recovered token
        return Verdict(accepted=accepted, tokens=commit(draft, accepted, last))
