"""The suffix drafter: SuffixDecoding (Oliaro et al., arXiv 2411.04975), no model, no training.

Two kinds of suffix tree hold counts of every token sequence seen (up to ``max_depth`` long):

- a *local* tree per request, over its prompt and its output so far;
- one *global* tree over previous responses (never prompts): the offline index
  (``specdec.models.suffix_index``) at start-up, then every served request's output as it is
  committed (from its first round on, as in vLLM; ``online=False`` drops it again when the
  request ends; the final round's tokens are missing, since the engine does not commit a
  finished request to its drafter). It is bounded by ``max_cached_requests`` responses, oldest out first (the
  index's sequences count too, and go first).

Each round, for every match length m of the context's suffix found in a tree, it walks the most
frequent child from the matched node; a token's probability is the product of child/parent
counts along the path; the walk stops below ``min_token_prob`` or at the budget
``min(max_draft, floor(factor * m + offset))``. A draft's *score* is the sum of its tokens'
probabilities (its expected accepted length, if the probabilities were right); the best score
over both trees wins, the local tree on ties.

The trees are arctic-inference's C++ ``SuffixDecodingCache`` (the one vLLM's ``method: suffix``
imports); this module owns the request bookkeeping and the Drafter protocol. A draft is
deterministic, so under sampling its proposal is one-hot and rejection sampling stays lossless.

Its "hidden state" for a PACER pre-verifier is four hand-made features per drafted token: the
token's path probability, the match length (over ``max_depth``), the token's position (over 8)
and a constant 1.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import torch

from specdec.algorithms.sampling import Sampling
from specdec.knobs import Knobs, knob
from specdec.models.drafter import DraftBlock
from specdec.models.suffix_index import SuffixIndex

FEATURES = 4


@dataclass(frozen=True)
class SuffixOptions(Knobs):
    """Per-request options of the suffix drafter (a request's ``SpecSettings`` section
    ``suffix``): the walk's budget is min(max_len, floor(factor * match + offset))."""

    factor: float = knob(2.0, "suffix budget: tokens per matched context token", ge=0)
    offset: float = knob(0.0, "suffix budget: tokens added to factor * match")
    min_prob: float = knob(0.05, "suffix walk: stop below this path probability", ge=0, le=1)
    max_len: int = knob(16, "longest draft of a round", ge=1, flat="max_draft")


@dataclass(frozen=True)
class SuffixConfig:
    """Deployment-level settings of the suffix drafter (per-request ones: ``SuffixOptions``)."""

    index: str | None = None  # a suffix-index directory or models:/NAME@ALIAS; None: no index
    max_depth: int = 64  # longest sequence a tree counts; also the longest context matched
    max_cached_requests: int = 100_000  # responses the global tree keeps (-1: no bound)
    online: bool = True  # served outputs join the global tree (False: the index only, "cold")

    def __post_init__(self):
        if self.max_depth < 1:
            raise ValueError(f"suffix max_depth must be >= 1, got {self.max_depth}")
        if self.max_cached_requests < -1:
            raise ValueError("suffix max_cached_requests must be >= 0, or -1 for no bound, "
                             f"got {self.max_cached_requests}")


@dataclass(frozen=True)
class SuffixDraft:
    tokens: tuple[int, ...]  # the walked path, best tree
    probs: tuple[float, ...]  # [len(tokens)] path probability of each token
    match_len: int  # length of the context suffix it continues

    @property
    def score(self) -> float:
        return float(sum(self.probs))


@dataclass
class SuffixState:
    key: tuple[str, int]  # the request's id in the cache
    context: list[int]  # prompt + committed output
    options: SuffixOptions
    draft: SuffixDraft | None = None  # this round's speculation, once made
    handed: int = 0  # how many of its tokens this round's propose calls returned
    source: str | None = None  # "suffix" once this round drafted any token


class SuffixDrafter:
    needs_target_features = False
    max_draft_len = None
    hidden_size = FEATURES
    reads_settings = True  # start() takes the request's SpecSettings (for its suffix section)
    drafts_whole = True  # a round's draft is walked once (speculate)

    def __init__(self, vocab_size: int, config: SuffixConfig = SuffixConfig(),
                 index: SuffixIndex | None = None):
        from arctic_inference.suffix_decoding import SuffixDecodingCache

        self.vocab_size, self.config = vocab_size, config
        self.cache = SuffixDecodingCache(config.max_depth, config.max_cached_requests)
        self._ids = itertools.count()
        if index is not None:
            if index.vocab_size != vocab_size:
                raise ValueError(f"suffix index for vocabulary {index.vocab_size} ({index.target}) "
                                 f"does not match the target's {vocab_size}")
            for seq in index.sequences:
                self.remember(seq)

    @classmethod
    def load(cls, vocab_size: int, config: SuffixConfig = SuffixConfig()) -> SuffixDrafter:
        index = SuffixIndex.load(config.index) if config.index else None
        return cls(vocab_size, config, index)

    def remember(self, response) -> tuple[str, int]:
        """Add one finished response to the global tree (evicting the oldest past the bound);
        returns its key for ``forget``."""
        key = ("index", next(self._ids))
        self.cache.start_request(key, [])
        self.cache.add_active_response(key, list(response))
        self.cache.stop_request(key)
        return key

    def forget(self, key: tuple[str, int]) -> None:
        """Take a remembered response out of the global tree (if it is still there)."""
        if key in self.cache.cached_requests:
            self.cache.evict_cached_response(key)

    @property
    def cached_responses(self) -> int:
        return len(self.cache.cached_requests)

    # ---- the Drafter protocol ---------------------------------------------------------------
    def start(self, prompt_ids: list[int], features=None, settings=None) -> SuffixState:
        """``settings``: the request's ``SpecSettings`` (None: the default options)."""
        key = ("request", next(self._ids))
        self.cache.start_request(key, list(prompt_ids))
        options = SuffixOptions() if settings is None else settings.section("suffix")
        return SuffixState(key, list(prompt_ids), options)

    def speculate(self, state: SuffixState) -> SuffixDraft:
        """This round's best path (made once per round; later calls return the same)."""
        if state.draft is None:
            o = state.options
            found = self.cache.speculate(
                state.key, state.context[-self.config.max_depth:], max_spec_tokens=o.max_len,
                max_spec_factor=o.factor, max_spec_offset=o.offset, min_token_prob=o.min_prob)
            state.draft = SuffixDraft(tuple(found.token_ids), tuple(found.probs), found.match_len)
        return state.draft

    def propose(self, state: SuffixState, n: int, sampling: Sampling) -> DraftBlock:
        draft = self.speculate(state)
        lo, hi = state.handed, min(state.handed + max(n, 0), len(draft.tokens))
        state.handed = hi
        if hi > lo:
            state.source = "suffix"
        tokens = torch.tensor(draft.tokens[lo:hi], dtype=torch.long)
        hidden = torch.tensor([[draft.probs[i], draft.match_len / self.config.max_depth, i / 8, 1.0]
                               for i in range(lo, hi)]).reshape(-1, FEATURES)
        probs = None
        if not sampling.greedy:  # a deterministic proposal: one-hot distributions
            probs = torch.nn.functional.one_hot(tokens, self.vocab_size).double()
        confidence = torch.tensor(draft.probs[lo:hi], dtype=torch.float64)
        return DraftBlock(tokens, hidden, probs, confidence)

    def commit(self, state: SuffixState, tokens: list[int], features=None) -> None:
        """The committed tokens extend the local tree and the request's response in the global
        tree at once (arctic-inference's ``add_active_response``)."""
        self.cache.add_active_response(state.key, list(tokens))
        state.context.extend(tokens)
        state.draft, state.handed, state.source = None, 0, None

    def finish(self, state: SuffixState) -> None:
        """The request is over: its local tree goes; its response stays in the global tree
        (unless the drafter is not ``online``: then it leaves too)."""
        if state.key in self.cache.active_requests:
            self.cache.stop_request(state.key)
        if not self.config.online and state.key in self.cache.cached_requests:
            self.cache.evict_cached_response(state.key)
