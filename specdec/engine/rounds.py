"""The round program: one request's speculative rounds as a step machine that does no I/O.

What this module is: ``RoundProgram``, which owns one request's progress -- its tokens, the
room and limit of each draft, the cut at EOS / stop tokens / stop strings / the token budget,
the finish reason, the stats and the log probabilities -- and ``RoundProgram.steps``, a
generator that yields what it needs next and is sent each answer:

    step                      answer                        what the driver does
    Open(prompt, params)      Opened(room, cap, times)      prefill the prompt, start the drafter
    Propose(limit)            Draft                         draft at most ``limit`` tokens
    Verify(draft)             Verified(result, room, cap)   one target pass, verify, crop
    Emit(tokens)              None                          hand the round's new tokens on
    Commit(result, drafted)   seconds it took, or None      the drafter catches up on the round
    Finish(reason)            (the program ends)            the request is done

One round is Propose -> Verify -> [Emit] -> Commit, and the last one ends with Finish instead
of Commit (the drafter never sees a round after which nothing is drafted). ``limit`` may be 0
(the last round: only the bonus token is left to commit, or the context is full), and a driver
without a drafter answers every Propose with an empty draft (plain decoding). A driver may
defer a Commit and deliver it with the next Propose's call: the served target actor does
(one drafter call per round), the engine commits at once; the tokens are the same.

Who drives it: ``specdec.engine.engine.Engine`` (local ``TargetWorker`` / ``DraftWorker``,
synchronously), ``actors.target.TargetActor.rounds`` (a served request, its drafts from a
drafter actor or the target's own drafter) and
``specdec.training.simulation`` (the raw models, full-window drafts, records taken from its
own verify answers). So every path commits exactly the same tokens.

What it is not: no model, worker or actor call, no clock (drivers time their calls and report
the seconds in the answers), no tokeniser (stop strings come as a ``StopStrings``).
"""

from __future__ import annotations

from collections.abc import Callable, Generator, Iterator
from dataclasses import dataclass

from specdec.engine.logprobs import TokenLogprobs
from specdec.engine.settings import GenerationParams
from specdec.engine.stats import RequestStats
from specdec.engine.stops import StopStrings
from specdec.engine.workers import Draft, RoundResult


# ---- the steps the program yields ----------------------------------------------------------
@dataclass(frozen=True)
class Open:
    prompt_ids: list[int]
    params: GenerationParams


@dataclass(frozen=True)
class Propose:
    limit: int  # longest draft; the bonus token always comes on top of it (0: draft nothing)


@dataclass(frozen=True)
class Verify:
    draft: Draft


@dataclass(frozen=True)
class Emit:
    tokens: list[int]  # the tokens this round added to the output (never empty)


@dataclass(frozen=True)
class Commit:
    """What the target committed in a round, for the drafter to catch up on."""

    result: RoundResult
    drafted: int  # draft length of that round (the policy's feedback)


@dataclass(frozen=True)
class Finish:
    reason: str  # "stop" (EOS, a stop token or a stop string) or "length"


Step = Open | Propose | Verify | Emit | Commit | Finish


# ---- the answers it is sent ----------------------------------------------------------------
@dataclass(frozen=True)
class Opened:
    room: int  # draft tokens the context has room for in the first round
    target_s: float = 0.0  # the prefill
    drafter_s: float = 0.0  # the drafter's start
    draft_cap: int | None = None  # load-aware cap on the first draft (None: none)


@dataclass(frozen=True)
class Verified:
    result: RoundResult
    room: int  # draft tokens the context has room for in the next round
    draft_cap: int | None = None  # load-aware cap on the next draft (None: none)


def drive(steps: Generator[Step, object, None], answer: Callable[[Step], object]) -> Iterator[list[int]]:
    """Run a program's ``steps`` to its ``Finish`` with a synchronous ``answer(step)`` (the
    engine's and the simulation's drivers); yield the tokens of each ``Emit``."""
    step = next(steps)
    while not isinstance(step, Finish):
        reply = answer(step)
        if isinstance(step, Emit):
            yield step.tokens
        step = steps.send(reply)


def truncate(tokens: list[int], budget: int, eos: frozenset[int]) -> tuple[list[int], str | None]:
    """Cut a round's committed tokens at the first EOS or at the token budget."""
    for i, token in enumerate(tokens[:budget]):
        if token in eos:
            return tokens[: i + 1], "stop"
    if len(tokens) >= budget:
        return tokens[:budget], "length"
    return tokens, None


class RoundProgram:
    """One request's progress; ``steps(eos)`` runs its rounds. Read the results off it:
    ``token_ids``, ``finish_reason``, ``stats``, ``all_logprobs()``. A round that runs past
    a stop token or stop string is cut there as at EOS; the stats count only the tokens kept."""

    def __init__(self, prompt_ids: list[int], params: GenerationParams,
                 stops: StopStrings | None = None):
        self.params = params
        self.prompt_ids = list(prompt_ids)
        self.stops = stops
        self.token_ids: list[int] = []
        self.logprobs: list[TokenLogprobs] = []  # one part per round, when params.logprobs is set
        self.finish_reason: str | None = None
        self.stats = RequestStats()

    def steps(self, eos: frozenset[int]) -> Generator[Step, object, None]:
        """The request's whole life, step by step (see the module docstring)."""
        eos = eos | self.params.stop_token_ids
        opened = yield Open(self.prompt_ids, self.params)
        self._opened(opened)
        room, cap = opened.room, opened.draft_cap
        while True:
            draft = yield Propose(self.limit(room, cap))
            self._drafted(draft)
            verified = yield Verify(draft)
            new = self._settle(draft, verified.result, room, eos)
            if new:
                yield Emit(new)
            if self.finish_reason is not None:
                yield Finish(self.finish_reason)
                return
            seconds = yield Commit(verified.result, len(draft.tokens))
            self.stats.drafter_s += seconds or 0.0
            room, cap = verified.room, verified.draft_cap

    def limit(self, room: int, cap: int | None = None) -> int:
        """Longest draft for the next round; the bonus token always comes on top of it."""
        limit = min(self.params.max_new_tokens - len(self.token_ids) - 1, room)
        return limit if cap is None else min(limit, cap)

    def all_logprobs(self) -> TokenLogprobs | None:
        """The kept tokens' log probabilities, when the request asked for them."""
        return None if self.params.logprobs is None else TokenLogprobs.concat(self.logprobs)

    # ---- bookkeeping -------------------------------------------------------------------------
    def _opened(self, opened: Opened) -> None:
        """Account for the prefill (one target pass)."""
        self.stats.target_s += opened.target_s
        self.stats.drafter_s += opened.drafter_s
        self.stats.target_passes += 1

    def _drafted(self, draft: Draft) -> None:
        self.stats.drafter_s += draft.drafter_s
        self.stats.preverifier_s += draft.preverifier_s
        if draft.source is not None:
            self.stats.draft_sources[draft.source] += 1

    def _settle(self, draft: Draft, result: RoundResult, room: int,
                eos: frozenset[int]) -> list[int]:
        """Record a verified round; return the tokens it added. ``room`` is the one the draft
        was limited by; after this, ``finish_reason`` is set once the request is done."""
        budget = self.params.max_new_tokens - len(self.token_ids)
        self.stats.target_s += result.target_s
        self.stats.record_round(len(draft.tokens), result.accepted, result.regret,
                                result.exceptions, result.passes)
        new, reason = truncate(result.tokens, budget, eos)
        if self.stops is not None:
            keep = self.stops.cut(self.token_ids + new, len(self.token_ids))
            if keep is not None:
                new, reason = new[: keep - len(self.token_ids)], "stop"
        if result.logprobs is not None:
            self.logprobs.append(result.logprobs.head(len(new)))
        if reason is None and room - result.accepted < 1:
            reason = "length"  # the context is full
        self.token_ids.extend(new)
        self.stats.committed += len(new)
        self.finish_reason = reason
        return new
