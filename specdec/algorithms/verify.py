"""Strict greedy verification and the catalog of verifiers.

What this module is: ``StrictVerifier`` (lossless greedy) and ``VERIFIERS``, the catalog of
verifiers ("strict", "asd", "sample"), with ``make_verifier`` to build one by name. The types
every verifier shares (``VerifyInputs``, ``Verdict``, the ``Verifier`` protocol, the shape
check; the terms K, V, logits, draft, y*, bonus) are in ``verdict.py``, below this module and
``asd.py`` / ``rejection.py``; they are re-exported here.

What it is not: no model calls, no drafting, no KV-cache bookkeeping. A verifier sees the
logits of ONE target pass and the draft it scored, and says which tokens to commit; what it
keeps per request (ASD's ledger) is the state ``new_state()`` makes, stored by the caller.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from specdec.algorithms.verdict import (
    Verdict,
    Verifier,
    VerifyInputs,
    check_round,
    commit,
    greedy_tokens,
)
from specdec.catalog import Catalog, Entry

__all__ = [
    "VERIFIERS",
    "StrictVerifier",
    "Verdict",
    "Verifier",
    "VerifyInputs",
    "check_round",
    "commit",
    "make_verifier",
    "verifier_names",
]


@dataclass(frozen=True)
class StrictVerifier:
    """Greedy verification: the output equals plain greedy decoding of the target, token for token.

    y*_i = argmax z_i (the first maximum on ties, ``greedy_tokens``); accept the longest prefix
    with x_i == y*_i, then commit the bonus y*_accepted.
    """

    lossless: ClassVar[bool] = True

    def new_state(self) -> None:
        return None

    def verify(self, state: None, inputs: VerifyInputs) -> Verdict:
        logits, draft = inputs.logits, inputs.draft
        k = check_round(logits, draft)
        greedy = greedy_tokens(logits)  # [K+1] y*_0 .. y*_K
        matches = draft == greedy[:k]  # [K] bool
        # accepted = length of the all-True prefix = sum of the running product.
        accepted = int(matches.long().cumprod(dim=0).sum())
        return Verdict(accepted=accepted, tokens=commit(draft, accepted, int(greedy[accepted])))


# The verifiers. ASD and sampling are named by import path, imported when first built.
# "temperature": the rule samples, so it runs only at temperature > 0 (the others are greedy
# and run only at 0). Only ASD has knobs (``config``): strict has none, and the sampler's
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
