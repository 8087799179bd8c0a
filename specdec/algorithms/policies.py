"""Draft-length policies: how many tokens to draft before calling the target.

A policy drives a drafter through one callable, ``propose(n) -> block`` (a block has ``len`` and
a ``hidden`` [n, D] tensor), and returns the blocks it kept; ``first(limit, state)`` says how many
tokens its first ``propose`` will ask for, so a caller can prepare many requests' first blocks in
one batched pass before running their policies one by one. It knows no models:

- ``FixedPolicy``: the standard window, always gamma tokens.
- ``HeuristicPolicy``: HF transformers' ``heuristic`` schedule: +2 after a round that accepted
  every drafted token, -1 (not below 1) otherwise.
- ``PacerPolicy``: PACER (arXiv 2602.01274). Draft in blocks of b; after block k the
  pre-verifier scores every drafted token; stop when block k's mean score is below t_k, else go
  on with t_{k+1} = min(1, t_k * rho). The failing block is still sent to the target: it is
  drafted already, and verifying it costs little. A block drafter's one-pass block is cut at
  sub-block granularity the same way.

Each policy's knobs are its config (``FixedConfig``, ``HeuristicConfig``, ``PacerConfig``: one
default, bound and help per knob, see ``specdec/knobs.py``); a policy is its config plus how it
drafts, so ``Policy(**asdict(config))`` builds it and the catalog entry names the config.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch

from specdec.catalog import Catalog, Entry
from specdec.knobs import Knobs, knob

Propose = Callable[[int], Any]  # n -> a draft block with len() and .hidden [n, D]
Scorer = Callable[[torch.Tensor], torch.Tensor]  # hidden [n, D] -> acceptance probs [n]


class DraftPolicy(Protocol):
    def new_state(self) -> Any: ...

    def draft(self, propose: Propose, limit: int, state: Any) -> list: ...

    def first(self, limit: int, state: Any) -> int:
        """The n of the first ``propose(n)`` that ``draft(propose, limit, state)`` will make (0:
        it proposes nothing). A batching caller prepares every request's first block at once."""

    def update(self, state: Any, drafted: int, accepted: int) -> None: ...


@dataclass(frozen=True)
class FixedConfig(Knobs):
    gamma: int = knob(4, "gamma: tokens drafted every round", ge=1, flat="gamma")


@dataclass(frozen=True)
class HeuristicConfig(Knobs):
    # a flat body's gamma is the first length, at most its max_draft (specdec.engine.settings)
    initial: int = knob(4, "the first round's draft length", ge=1, flat="gamma")
    max_len: int = knob(16, "longest draft of a round", ge=1, flat="max_draft")


@dataclass(frozen=True)
class PacerConfig(Knobs):
    block_size: int = knob(4, "PACER b: tokens per block", ge=1, flat="block_size")
    threshold: float = knob(0.5, "PACER t_1: the first block's threshold", ge=0, le=1,
                            flat="threshold")
    growth: float = knob(1.1, "PACER rho: threshold growth after each block", ge=1,
                         flat="growth")
    max_len: int = knob(16, "longest draft of a round", ge=1, flat="max_draft")


@dataclass(frozen=True)
class FixedPolicy(FixedConfig):
    def new_state(self):
        return None

    def draft(self, propose: Propose, limit: int, state) -> list:
        n = self.first(limit, state)
        return [propose(n)] if n > 0 else []

    def first(self, limit: int, state) -> int:
        return max(0, min(self.gamma, limit))

    def update(self, state, drafted: int, accepted: int) -> None:
        pass


@dataclass
class HeuristicState:
    length: int


@dataclass(frozen=True)
class HeuristicPolicy(HeuristicConfig):
    def __post_init__(self):
        super().__post_init__()
        if not 1 <= self.initial <= self.max_len:
            raise ValueError(f"need 1 <= initial <= max_len, got {self.initial}, {self.max_len}")

    def new_state(self) -> HeuristicState:
        return HeuristicState(self.initial)

    def draft(self, propose: Propose, limit: int, state: HeuristicState) -> list:
        n = self.first(limit, state)
        return [propose(n)] if n > 0 else []

    def first(self, limit: int, state: HeuristicState) -> int:
        return max(0, min(state.length, limit))

    def update(self, state: HeuristicState, drafted: int, accepted: int) -> None:
        grown = state.length + 2 if accepted == drafted else state.length - 1
        state.length = max(1, min(self.max_len, grown))


@dataclass
class PacerTrace:
    """What PACER saw in the last round: the mean score of each block and its threshold."""

    block_means: list[float] = field(default_factory=list)
    thresholds: list[float] = field(default_factory=list)


@dataclass(frozen=True)
class PacerPolicy(PacerConfig):
    scorer: Scorer = field(kw_only=True)  # the pre-verifier: hidden [n, D] -> probs [n]

    def new_state(self) -> PacerTrace:
        return PacerTrace()

    def draft(self, propose: Propose, limit: int, state: PacerTrace) -> list:
        state.block_means.clear()
        state.thresholds.clear()
        blocks, drafted, t = [], 0, self.threshold
        limit = min(limit, self.max_len)
        while drafted < limit:
            block = propose(min(self.block_size, limit - drafted))
            if len(block) == 0:
                break
            blocks.append(block)
            drafted += len(block)
            # the pre-verifier is causal, so scoring the whole draft gives each token its context
            scores = self.scorer(torch.cat([b.hidden for b in blocks]))[-len(block):]
            mean = float(scores.mean())
            state.block_means.append(mean)
            state.thresholds.append(t)
            if mean < t:
                break
            t = min(1.0, t * self.growth)
        return blocks

    def first(self, limit: int, state: PacerTrace) -> int:
        return max(0, min(self.block_size, limit, self.max_len))

    def update(self, state, drafted: int, accepted: int) -> None:
        pass


# The draft policies. "scorer": the policy reads a pre-verifier's scores (a callable from the
# drafter's hidden states to per-token probabilities), so the drafter side must hold one.
POLICIES = Catalog(
    "draft policy",
    Entry("fixed", FixedPolicy, "a fixed window of gamma tokens", config=FixedConfig),
    Entry("heuristic", HeuristicPolicy, "HF's schedule: +2 after a full accept, -1 otherwise",
          config=HeuristicConfig),
    Entry("pacer", PacerPolicy, "PACER: blocks until the pre-verifier's mean score drops",
          needs=frozenset({"scorer"}), config=PacerConfig),
    plural="draft policies",
)


def make_policy(name: str, config: Any = None, **params) -> DraftPolicy:
    """Build a policy by name from its config (None: the defaults) and ``params`` (knobs that
    override it; PACER's ``scorer=``). Unknown names and bad values raise."""
    if "scorer" in POLICIES.get(name).needs and params.get("scorer") is None:
        raise ValueError(f"the {name} policy needs a pre-verifier (scorer)")
    return POLICIES.build_from(name, config, **params)
