"""ASD -- Approximate Speculative Decoding: greedy verification that may accept a few near-ties.

Reference: "Approximate Speculative Decoding" (ASD), arXiv 2608.03447. The authors' configs use
budget B = 8.0, gate g = 0.25, max exceptions M = 2. ``AsdConfig`` holds the knobs, each with its
one default: g and M are the authors', B is 0 (strict) so that ASD is opt-in per request.

What this module is: the acceptance rule, as a slow readable specification
(``asd_accept_reference``), as the O(K) vectorised version the engine uses (``asd_accept``), and
as a ``Verifier`` (``AsdVerifier``: its ``AsdConfig`` plus the rule), whose per-request state is the ledger (``AsdLedger``: the
regret ``s`` spent so far; ``verify`` adds each round's ``Verdict.regret`` to it). What it is
not: no storage of the ledger (the caller keeps the state with the request), no sampling.

The rule, for one round (terms as in ``verdict.py``; ``z_i`` is row i of the raw target logits):

* regret    r_i = max(0, z_i(y*_i) - z_i(x_i))    (0 for matches)
* mismatch  m_i = [x_i != y*_i]
* value     q_i = K - i                           (``normalized``: (K - i) / K)
* spent this round up to i:  C_i = sum_{j <= i} m_j r_j
* a match is always admissible; a mismatch is admissible iff
      r_i / q_i <= g  and  sum_{j <= i} m_j <= M  and  C_i <= B - s,
  with B - s > 0, g > 0 and M > 0. So B = 0, g = 0 or M = 0 recovers strict greedy exactly,
  ties included (a tie mismatch has r_i = 0, which the gate alone would let through at g = 0).
* accepted = length of the admissible prefix; commit x_0 .. x_{accepted-1}, then the greedy bonus
  y*_accepted. The round spends sum of r_i over accepted mismatches, and counts them as exceptions.

Why the suffix after an accepted mismatch is reused for free: the verify pass was teacher-forced
on the draft, so row i+1 .. K were computed under the realised prefix x_0 .. x_i -- the very
prefix we commit. Their argmaxes are what the target would say next, with no extra pass.
"""

from __future__ import annotations

import numbers
from dataclasses import dataclass

import torch

from specdec.algorithms.verdict import Verdict, VerifyInputs, check_round, commit, greedy_tokens
from specdec.knobs import Knobs, knob

__all__ = ["AsdConfig", "AsdLedger", "AsdVerifier", "asd_accept", "asd_accept_reference"]


def _check_params(budget: float, gate: float, max_exceptions: int) -> None:
    # `not x >= 0` also rejects NaN.
    if not budget >= 0:
        raise ValueError(f"ASD budget must be >= 0 (0 = strict greedy), got {budget}")
    if not gate >= 0:
        raise ValueError(f"ASD gate must be >= 0 (0 = strict greedy), got {gate}")
    if isinstance(max_exceptions, bool) or not isinstance(max_exceptions, numbers.Integral):
        raise ValueError(f"ASD max_exceptions must be an integer, got {max_exceptions!r}")
    if max_exceptions < 0:
        raise ValueError(
            f"ASD max_exceptions must be >= 0 (0 = strict greedy), got {max_exceptions}"
        )


def _check_spent(spent: float) -> None:
    if not spent >= 0:
        raise ValueError(f"ASD spent (the request's regret ledger) must be >= 0, got {spent}")


def _exceptions_allowed(budget: float, gate: float, max_exceptions: int, spent: float) -> bool:
    """Whether any mismatch may be accepted this round: B - s > 0, g > 0 and M > 0."""
    return budget - spent > 0 and gate > 0 and max_exceptions > 0


def _first_argmax(row: list[float]) -> int:
    # Python's max keeps the first of equal keys: the first maximum, like torch.argmax.
    return max(range(len(row)), key=row.__getitem__)


def asd_accept_reference(
    logits: torch.Tensor,
    draft: torch.Tensor,
    *,
    budget: float,
    gate: float,
    max_exceptions: int,
    spent: float = 0.0,
    normalized: bool = False,
) -> tuple[int, float, int]:
    """The specification: a plain loop over positions. Returns (accepted, regret, exceptions)."""
    _check_params(budget, gate, max_exceptions)
    _check_spent(spent)
    k = check_round(logits, draft)
    rows = logits.tolist()  # K+1 lists of V floats
    xs = draft.tolist()
    allowed = _exceptions_allowed(budget, gate, max_exceptions, spent)
    accepted, regret, exceptions = 0, 0.0, 0
    for i in range(k):
        best = _first_argmax(rows[i])
        if xs[i] == best:  # a match is always admissible
            accepted += 1
            continue
        r = max(0.0, rows[i][best] - rows[i][xs[i]])
        value = (k - i) / k if normalized else float(k - i)
        admissible = (
            allowed
            and r / value <= gate
            and exceptions + 1 <= max_exceptions
            and regret + r <= budget - spent
        )
        if not admissible:
            break
        accepted, regret, exceptions = accepted + 1, regret + r, exceptions + 1
    return accepted, regret, exceptions


def _accept(
    logits: torch.Tensor,
    draft: torch.Tensor,
    greedy: torch.Tensor,
    *,
    budget: float,
    gate: float,
    max_exceptions: int,
    spent: float,
    normalized: bool,
) -> tuple[int, float, int]:
    """Vectorised rule, O(K), no loop over positions. greedy: [K+1] = argmax of each row."""
    k = draft.shape[0]
    if k == 0:
        return 0, 0.0, 0
    idx = draft[:, None]  # [K, 1]
    z_best = logits[:k].gather(1, greedy[:k, None]).squeeze(1).double()  # [K] z_i(y*_i)
    z_draft = logits[:k].gather(1, idx).squeeze(1).double()  # [K] z_i(x_i)
    mismatch = draft != greedy[:k]  # [K] m_i
    regret = torch.where(mismatch, (z_best - z_draft).clamp(min=0), 0.0)  # [K] r_i
    value = k - torch.arange(k, dtype=torch.float64, device=logits.device)  # [K] q_i = K - i
    if normalized:
        value = value / k  # q_i = (K - i) / K
    count = mismatch.long().cumsum(dim=0)  # [K] sum_{j<=i} m_j
    cost = regret.cumsum(dim=0)  # [K] C_i = sum_{j<=i} m_j r_j (r_j = 0 on matches)
    exception_ok = (regret / value <= gate) & (count <= max_exceptions) & (cost <= budget - spent)
    exception_ok &= _exceptions_allowed(budget, gate, max_exceptions, spent)
    admissible = ~mismatch | exception_ok  # [K] bool
    accepted = int(admissible.long().cumprod(dim=0).sum())
    if accepted == 0:
        return 0, 0.0, 0
    # Within the accepted prefix, the running sums count exactly the accepted mismatches.
    return accepted, float(cost[accepted - 1]), int(count[accepted - 1])


def asd_accept(
    logits: torch.Tensor,
    draft: torch.Tensor,
    *,
    budget: float,
    gate: float,
    max_exceptions: int,
    spent: float = 0.0,
    normalized: bool = False,
) -> tuple[int, float, int]:
    """Vectorised ASD acceptance (cumsum / cumprod). Returns (accepted, regret, exceptions)."""
    _check_params(budget, gate, max_exceptions)
    _check_spent(spent)
    check_round(logits, draft)
    greedy = greedy_tokens(logits)  # [K+1]
    return _accept(
        logits,
        draft,
        greedy,
        budget=budget,
        gate=gate,
        max_exceptions=max_exceptions,
        spent=spent,
        normalized=normalized,
    )


@dataclass
class AsdLedger:
    """One request's ASD state: the regret s spent over its rounds so far."""

    spent: float = 0.0


@dataclass(frozen=True)
class AsdConfig(Knobs):
    """ASD's knobs. B = 0 is strict greedy; the authors' config is B = 8.0, g = 0.25, M = 2."""

    budget: float = knob(0.0, "ASD B: regret a request may spend over its life (0 = strict)",
                         ge=0)
    gate: float = knob(0.25, "ASD g: largest regret per unit of value r_i / q_i", ge=0)
    max_exceptions: int = knob(2, "ASD M: accepted mismatches per round", ge=0)
    normalized: bool = knob(False, "ASD value q_i = (K - i) / K instead of K - i")


@dataclass(frozen=True)
class AsdVerifier(AsdConfig):
    """ASD as a Verifier: its config plus the rule."""

    @property
    def lossless(self) -> bool:
        """True iff the settings reduce ASD to strict greedy."""
        return self.budget == 0 or self.gate == 0 or self.max_exceptions == 0

    def new_state(self) -> AsdLedger:
        return AsdLedger()

    def verify(self, state: AsdLedger, inputs: VerifyInputs) -> Verdict:
        """One round under the request's ledger ``state``; the round's regret is added to it."""
        logits, draft, spent = inputs.logits, inputs.draft, state.spent
        _check_spent(spent)
        check_round(logits, draft)
        greedy = greedy_tokens(logits)  # [K+1] y*_0 .. y*_K
        accepted, regret, exceptions = _accept(
            logits,
            draft,
            greedy,
            budget=self.budget,
            gate=self.gate,
            max_exceptions=self.max_exceptions,
            spent=spent,
            normalized=self.normalized,
        )
        tokens = commit(draft, accepted, int(greedy[accepted]))
        state.spent += regret
        return Verdict(accepted=accepted, tokens=tokens, regret=regret, exceptions=exceptions)
