"""The drafter protocol: what the engine needs from any proposer of draft tokens.

A drafter extends the current round's draft block by block (``propose``) and is told what the
target committed at the end of the round (``commit``). All per-request state lives in the
object returned by ``start``; the drafter itself is shared across requests. Implementations:
``ARDrafter`` (a small draft LM), ``BlockDrafter`` (DFlash-style, parallel),
``NgramDrafter`` (prompt lookup, no model), ``SuffixDrafter`` (SuffixDecoding, no model) and
``HybridDrafter`` (suffix or block, per round).

Optional parts: a drafter with ``reads_settings = True`` gets the request's ``SpecSettings`` as
``start(..., settings=)`` and reads its own section there (``settings.section("suffix")``, the
options its catalog entry names as ``config``); one with a ``finish(state)`` method is told
when a request ends (however it ends); one whose state has a ``source`` attribute says where each
round's draft came from; one with ``drafts_whole = True`` proposes a whole window for what its
blocks would cost (a model-free drafter finds a round's draft at once): under the acceptance
model ``DraftWorker`` then proposes every request's window at once, scores them all in one
call, and each request's policy reads its window block by block.

Batching parts (optional; ``DraftWorker.draft_batch`` / ``commit_batch`` use them when there):
``prepare(requests)``, requests a list of (state, n) with n the size of the round's first
``propose``, does in one batched pass the model work those proposes would do one by one (the
block drafter's block forward); it is a hint: every ``propose`` returns exactly what it would
without it, and only ``propose`` draws from a request's generator. ``commit_batch(requests)``,
a list of (state, tokens, features), is ``commit`` for each, batched.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

import torch

from specdec.algorithms.sampling import Sampling


@dataclass(frozen=True)
class DraftBlock:
    """Tokens a drafter proposed in one ``propose`` call (n may be 0: nothing to propose)."""

    tokens: torch.Tensor  # [n] long, target vocabulary ids
    # [n, D] the drafter's state that produced each token: the pre-verifier's input, and the
    # acceptance model's drafter signals (specdec.models.acceptance)
    hidden: torch.Tensor
    probs: torch.Tensor | None = None  # [n, V] proposal distribution, only when sampling
    # [n] the drafter's estimate that the block up to each token is accepted (the suffix tree's
    # path probability); None: it makes none
    confidence: torch.Tensor | None = None

    def __len__(self) -> int:
        return int(self.tokens.shape[0])

    def part(self, lo: int, hi: int) -> DraftBlock:
        """Its tokens ``lo`` to ``hi`` (exclusive)."""
        cut = slice(lo, hi)
        return DraftBlock(self.tokens[cut], self.hidden[cut],
                          None if self.probs is None else self.probs[cut],
                          None if self.confidence is None else self.confidence[cut])

    @staticmethod
    def empty(hidden_size: int) -> DraftBlock:
        return DraftBlock(torch.zeros(0, dtype=torch.long), torch.zeros(0, hidden_size))


class Drafter(Protocol):
    hidden_size: int  # width D of DraftBlock.hidden
    vocab_size: int  # must equal the target's
    max_draft_len: int | None  # longest draft one round can hold; None = unbounded
    needs_target_features: bool  # whether start/commit need the target's tapped features

    def start(self, prompt_ids: list[int], features: torch.Tensor | None) -> Any:
        """New request state. features: [len(prompt) - 1, F] taps of all but the last token."""

    def propose(self, state: Any, n: int, sampling: Sampling) -> DraftBlock:
        """Extend this round's draft by up to n tokens."""

    def commit(self, state: Any, tokens: list[int], features: torch.Tensor | None) -> None:
        """End the round: ``tokens`` were committed; features: [len(tokens), F] taps of the
        positions that became verified context (the previous pending token and the accepted
        drafts), in order."""

