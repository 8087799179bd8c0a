"""What every verifier shares: its inputs, its ``Verdict``, the ``Verifier`` protocol, the checks.

What this module is: the boundary types of one verification (``VerifyInputs`` in, ``Verdict``
out), the ``Verifier`` protocol every rule implements, and the shape check, greedy choice and
commit helper they all use. It sits below ``verify.py`` (strict greedy and the catalog), ``asd.py`` and
``rejection.py``, which import it and not each other. What it is not: no rule, no catalog.

Terms, used by every verifier:

* ``K`` -- draft length (may be 0: a plain decoding step); ``V`` -- vocabulary size.
* ``logits`` [K+1, V] -- raw target logits from one pass over ``[c, x_0 .. x_{K-1}]``; row ``i``
  predicts the token at draft position ``i``, row ``K`` the position after the last draft token.
* ``draft`` [K] long -- the drafted tokens ``x_0 .. x_{K-1}``.
* ``y*_i = argmax z_i`` -- the target's greedy token at position ``i`` (first maximum on ties).
* bonus -- the one token the target adds after the accepted prefix, so every round commits at
  least one token: ``tokens = draft[:accepted] + [bonus]``.

The protocol mirrors the draft policies': a verifier is a frozen rule with its settings;
whatever it keeps per request across rounds (ASD's regret ledger) lives in the state that
``new_state()`` makes, which the caller stores with the request and passes to every
``verify(state, inputs)``. A verifier reads only the fields of ``inputs`` it needs.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

import torch

__all__ = ["Verdict", "Verifier", "VerifyInputs", "check_round", "commit"]


@dataclass(frozen=True)
class VerifyInputs:
    """One round to verify: the target's scores of the draft and what sampling rules need."""

    logits: torch.Tensor  # [K+1, V] raw target logits
    draft: torch.Tensor  # [K] long, x_0 .. x_{K-1}
    draft_probs: torch.Tensor | None = None  # [K, V] the drafter's proposal (sampling only)
    generator: torch.Generator | None = None  # the request's random stream (sampling only)

    def __post_init__(self):
        """One device for the round: a GPU kernel takes no CPU operand (nor a CPU generator),
        so the caller moves the logits or the draft at its own boundary (the serving workers
        and the simulation verify on the CPU, where drafts and generators live)."""
        device = self.logits.device
        if self.draft.device != device:
            raise ValueError(f"VerifyInputs: draft on {self.draft.device}, logits on {device}; "
                             f"move one of them first")
        if self.generator is not None and self.generator.device.type != device.type:
            raise ValueError(f"VerifyInputs: generator on {self.generator.device}, logits on "
                             f"{device}; sample where the generator lives")


@dataclass(frozen=True)
class Verdict:
    accepted: int  # number of draft tokens accepted (a prefix of the draft)
    tokens: list[int]  # committed tokens: draft[:accepted] + [bonus]; len == accepted + 1
    regret: float = 0.0  # regret spent in this round (ASD only)
    exceptions: int = 0  # accepted mismatches in this round (ASD only)

    def __post_init__(self):
        if self.accepted < 0:
            raise ValueError(f"accepted must be >= 0, got {self.accepted}")
        if len(self.tokens) != self.accepted + 1:
            raise ValueError(
                f"a round commits accepted + 1 tokens: accepted={self.accepted}, "
                f"got {len(self.tokens)} tokens"
            )


@runtime_checkable
class Verifier(Protocol):
    lossless: bool  # True when the committed stream has exactly the target's distribution

    def new_state(self) -> Any:
        """A fresh request's state (None when the rule keeps nothing across rounds)."""

    def verify(self, state: Any, inputs: VerifyInputs) -> Verdict:
        """Which tokens one round commits; updates ``state`` for the next round."""


def check_round(logits: torch.Tensor, draft: torch.Tensor) -> int:
    """Check the shapes of one round and return the draft length K."""
    if logits.dim() != 2:
        raise ValueError(f"logits must be [K+1, V], got shape {tuple(logits.shape)}")
    if draft.dim() != 1:
        raise ValueError(f"draft must be [K], got shape {tuple(draft.shape)}")
    if draft.dtype.is_floating_point or draft.dtype == torch.bool:
        raise ValueError(f"draft must hold integer token ids, got dtype {draft.dtype}")
    k = draft.shape[0]
    if logits.shape[0] != k + 1:
        raise ValueError(
            f"logits must have K+1 = {k + 1} rows for a draft of K = {k}, got {logits.shape[0]}"
        )
    vocab = logits.shape[1]
    if k > 0 and not (0 <= int(draft.min()) and int(draft.max()) < vocab):
        raise ValueError(f"draft token ids must lie in [0, {vocab})")
    return k


def greedy_tokens(logits: torch.Tensor) -> torch.Tensor:
    """y* of each row of ``logits`` [..., V]: the first maximum on ties, as ``argmax`` gives.
    Through ``max``, whose CPU kernel is the faster (docs/RESULTS.md#serve-defaults-chosen-by-measurement)."""
    return logits.max(dim=-1).indices


def commit(draft: torch.Tensor, accepted: int, last: int) -> list[int]:
    """The committed tokens: the accepted draft prefix, then one target token."""
    return [int(t) for t in draft[:accepted].tolist()] + [int(last)]
