"""The hybrid drafter: each round, the suffix draft or the block drafter's PACER draft.

Both are candidates, picked by expected accepted tokens (ArcticInference's hybrid rule, with
PACER's estimate standing in for the model draft's length):

- the suffix draft's estimate is its score, the sum of its path probabilities
  (``specdec.models.suffix``);
- the block draft's is PACER's: ``sum_j prod_{i <= j} p_i`` over the draft, p_i the
  pre-verifier's acceptance probability of token i (the expected accepted length if the
  acceptances were independent). PACER (arXiv 2602.01274) still sets the block draft's length.

When the suffix score alone reaches ``skip`` (``HybridOptions``) the block drafter's forward is skipped; the
suffix draft wins ties. The block drafter still commits the target's features of every verified
position each round, whichever draft won, so its context cache stays right: the hybrid needs the
target's features. It runs PACER itself (the request's ``pacer`` config, its ``max_len`` capped
by the block drafter), with the pre-verifier it was built with, so the engine
drives it with the ``fixed`` policy (``gamma`` caps whichever draft wins). ``state.source`` says
which draft a round sent ("suffix" or "block"); the engine counts them.

Batching (issue 17): ``prepare`` looks up every request's suffix draft (per request, no
forward) and runs the block pass in one batched forward for exactly the requests whose suffix
score is below ``skip``; ``commit_batch`` commits the suffix trees per request and the
block drafter's context rows in one pass.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from specdec.algorithms.policies import PacerConfig, PacerPolicy, make_policy
from specdec.algorithms.sampling import Sampling
from specdec.knobs import Knobs, knob
from specdec.models.block_drafter import BlockDrafter
from specdec.models.drafter import DraftBlock
from specdec.models.preverifier import PreVerifier
from specdec.models.suffix import SuffixDrafter, SuffixState


@dataclass(frozen=True)
class HybridOptions(Knobs):
    """Per-request options of the hybrid drafter (a request's ``SpecSettings`` section
    ``hybrid``)."""

    skip: float = knob(4.0, "hybrid: a suffix score at least this skips the block drafter", ge=0)


def pacer_estimate(probs: torch.Tensor) -> float:
    """Expected accepted tokens of a draft: sum_j prod_{i<=j} p_i; probs: [n] in [0, 1]."""
    return float(torch.cumprod(probs.double(), 0).sum()) if probs.numel() else 0.0


@dataclass
class HybridState:
    suffix: SuffixState
    block: object  # the block drafter's state
    pacer: PacerPolicy
    scores: list  # [the pre-verifier's last scores [n]], written by the scorer
    skip: float  # HybridOptions.skip
    chosen: DraftBlock | None = None  # this round's winning draft
    handed: int = 0
    source: str | None = None  # "suffix" | "block" once this round drafted any token


class HybridDrafter:
    needs_target_features = True
    max_draft_len = None
    hidden_size = 1  # each drafted token's estimated acceptance probability
    reads_settings = True
    pacer_inside = True  # it scores the block draft itself; the engine adds no pre-verifier

    def __init__(self, suffix: SuffixDrafter, block: BlockDrafter, preverifier: PreVerifier):
        if suffix.vocab_size != block.vocab_size:
            raise ValueError(f"hybrid: the suffix drafter's vocabulary ({suffix.vocab_size}) "
                             f"differs from the block drafter's ({block.vocab_size})")
        if preverifier.c.input_size != block.hidden_size:
            raise ValueError(f"hybrid: the pre-verifier reads {preverifier.c.input_size}-wide "
                             f"states; the block drafter's are {block.hidden_size}-wide")
        self.suffix, self.block, self.preverifier = suffix, block, preverifier
        self.vocab_size = block.vocab_size
        self.block_limit = min(block.max_draft_len or preverifier.c.max_positions,
                               preverifier.c.max_positions)

    def start(self, prompt_ids: list[int], features: torch.Tensor | None,
              settings=None) -> HybridState:
        """``settings``: the request's ``SpecSettings`` (None: the defaults); its ``pacer`` and
        ``hybrid`` sections are read here, its ``suffix`` section by the suffix drafter."""
        scores: list = [None]

        def scorer(hidden: torch.Tensor) -> torch.Tensor:
            scores[0] = self.preverifier.score(hidden)
            return scores[0]

        config = PacerConfig() if settings is None else settings.section("pacer")
        options = HybridOptions() if settings is None else settings.section("hybrid")
        pacer = make_policy("pacer", config, scorer=scorer,
                            max_len=min(config.max_len, self.block_limit))
        return HybridState(self.suffix.start(prompt_ids, None, settings),
                           self.block.start(prompt_ids, features), pacer, scores, options.skip)

    def prepare(self, requests: list[tuple[HybridState, int]]) -> None:
        """Before each (state, n)'s first ``propose(n)`` of the round: batch the block pass of
        those that will need it, the ones whose suffix draft of n tokens scores below
        ``skip``. Lookups only: no state but the block drafter's prepared pass changes."""
        need = [(state.block, n) for state, n in requests
                if n > 0 and state.chosen is None
                and self._suffix_score(state, n) < state.skip]
        if need:
            self.block.prepare(need)

    def _suffix_score(self, state: HybridState, n: int) -> float:
        """The score ``_choose`` sees for the suffix draft of up to n tokens."""
        probs = self.suffix.speculate(state.suffix).probs[:max(n, 0)]
        return float(torch.tensor(probs, dtype=torch.float32).sum())

    def propose(self, state: HybridState, n: int, sampling: Sampling) -> DraftBlock:
        if state.chosen is None:
            state.chosen = self._choose(state, n, sampling)
        c, lo = state.chosen, state.handed
        hi = min(lo + max(n, 0), len(c))
        state.handed = hi
        return DraftBlock(c.tokens[lo:hi], c.hidden[lo:hi], None if c.probs is None else c.probs[lo:hi])

    def _choose(self, state: HybridState, limit: int, sampling: Sampling) -> DraftBlock:
        """This round's draft: the suffix one unless PACER expects more of the block's."""
        suffix = self.suffix.propose(state.suffix, limit, sampling)
        suffix_score = self._suffix_score(state, limit)  # its tokens' path probabilities, summed
        if suffix_score >= state.skip:
            return self._pick(state, "suffix", suffix, suffix.hidden[:, :1])
        block = self._block_draft(state, limit, sampling)
        probs = state.scores[0] if len(block) else torch.zeros(0)
        if len(block) and pacer_estimate(probs) > suffix_score:
            return self._pick(state, "block", block, probs.reshape(-1, 1).float())
        return self._pick(state, "suffix", suffix, suffix.hidden[:, :1])

    def _block_draft(self, state: HybridState, limit: int, sampling: Sampling) -> DraftBlock:
        def propose(k: int) -> DraftBlock:
            return self.block.propose(state.block, k, sampling)

        blocks = [b for b in state.pacer.draft(propose, limit, state.pacer.new_state()) if len(b)]
        if not blocks:
            return DraftBlock.empty(self.block.hidden_size)
        probs = None if sampling.greedy else torch.cat([b.probs for b in blocks])
        return DraftBlock(torch.cat([b.tokens for b in blocks]),
                          torch.cat([b.hidden for b in blocks]), probs)

    @staticmethod
    def _pick(state: HybridState, source: str, draft: DraftBlock, hidden: torch.Tensor) -> DraftBlock:
        state.source = source if len(draft) else None
        return DraftBlock(draft.tokens, hidden, draft.probs)

    def commit(self, state: HybridState, tokens: list[int], features: torch.Tensor | None) -> None:
        self.commit_batch([(state, tokens, features)])

    def commit_batch(self, requests: list[tuple[HybridState, list[int], torch.Tensor | None]]):
        """``commit`` for many requests: the block drafter's new context rows in one pass."""
        self.block.commit_batch([(state.block, tokens, features)
                                 for state, tokens, features in requests])
        for state, tokens, _ in requests:
            self.suffix.commit(state.suffix, tokens)
            state.chosen, state.handed, state.source = None, 0, None

    def finish(self, state: HybridState) -> None:
        self.suffix.finish(state.suffix)
