"""Verification of one speculative-decoding round: the boundary types, strict greedy, the catalog.

What this module is: the ``Verdict`` a verifier returns, the ``Verifier`` protocol every
verification rule implements, ``StrictVerifier`` (lossless greedy), the shape checks shared by all
verifiers, and ``VERIFIERS``, the catalog of verifiers ("strict", "asd", "sample"), with
``make_verifier`` to build one by name.

What it is not: no model calls, no drafting, no KV-cache bookkeeping, no per-request state. A
verifier sees the logits of ONE target pass and the draft it scored, and says which tokens to
commit. The ASD ledger (regret spent so far) is owned by the caller and passed in as ``spent``.

Terms, used by every verifier:

* ``K`` -- draft length (may be 0: a plain decoding step); ``V`` -- vocabulary size.
* ``logits`` [K+1, V] -- raw target logits from one pass over ``[c, x_0 .. x_{K-1}]``; row ``i``
  predicts the token at draft position ``i``, row ``K`` the position after the last draft token.
* ``draft`` [K] long -- the drafted tokens ``x_0 .. x_{K-1}``.
* ``y*_i = argmax z_i`` -- the target's greedy token at position ``i`` (first maximum on ties).
* bonus -- the one token the target adds after the accepted prefix, so every round commits at
  least one token: ``tokens = draft[:accepted] + [bonus]``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar, Protocol, runtime_checkable

import torch

from specdec.catalog import Catalog, Entry

__all__ = [
    "VERIFIERS",
    "StrictVerifier",
    "Verdict",
    "Verifier",
    "check_round",
    "commit",
    "make_verifier",
    "verifier_names",
]


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

    def verify(
        self,
        logits: torch.Tensor,
        draft: torch.Tensor,
        *,
        spent: float = 0.0,
        draft_probs: torch.Tensor | None = None,
        generator: torch.Generator | None = None,
    ) -> Verdict: ...


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


def commit(draft: torch.Tensor, accepted: int, last: int) -> list[int]:
    """The committed tokens: the accepted draft prefix, then one target token."""
    return [int(t) for t in draft[:accepted].tolist()] + [int(last)]


@dataclass(frozen=True)
class StrictVerifier:
    """Greedy verification: the output equals plain greedy decoding of the target, token for token.

    y*_i = argmax z_i (torch.argmax returns the first maximum on ties); accept the longest prefix
    with x_i == y*_i, then commit the bonus y*_accepted.
    """

    lossless: ClassVar[bool] = True

    def verify(
        self,
        logits: torch.Tensor,
        draft: torch.Tensor,
        *,
        spent: float = 0.0,
        draft_probs: torch.Tensor | None = None,
        generator: torch.Generator | None = None,
    ) -> Verdict:
        k = check_round(logits, draft)
        greedy = logits.argmax(dim=-1)  # [K+1] y*_0 .. y*_K
        matches = draft == greedy[:k]  # [K] bool
        # accepted = length of the all-True prefix = sum of the running product.
        accepted = int(matches.long().cumprod(dim=0).sum())
        return Verdict(accepted=accepted, tokens=commit(draft, accepted, int(greedy[accepted])))


# The verifiers. ASD and sampling are named by import path: their modules import Verdict from
# this one. "temperature": the rule samples, so it runs only at temperature > 0 (the others are
# greedy and run only at 0). Only ASD has knobs (``config``): strict has none, and the sampler's
# temperature / top_k / top_p / min_p are the request's own fields (``GenerationParams``), which
# the caller passes to it.
VERIFIERS = Catalog(
    "verifier",
    Entry("strict", StrictVerifier, "lossless greedy: the longest prefix equal to the argmax"),
    Entry("asd", "specdec.algorithms.asd:AsdVerifier",
          "approximate greedy under a regret budget (budget, gate, max_exceptions, normalized)",
          config="specdec.algorithms.asd:AsdConfig"),
    Entry("sample", "specdec.algorithms.rejection:RejectionSampler",
          "speculative (rejection) sampling, lossless at temperature > 0",
          needs=frozenset({"temperature"})),
)


def verifier_names() -> list[str]:
    """The names make_verifier accepts, sorted."""
    return list(VERIFIERS.names())


def make_verifier(name: str, config: Any = None, **params) -> Verifier:
    """Build a verifier by name from its config (None: the defaults) and ``params``: "strict",
    "asd" (an ``AsdConfig``, or budget, gate, ...) or "sample" (temperature, top_k, ...)."""
    return VERIFIERS.build_from(name, config, **params)
