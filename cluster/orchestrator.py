"""The served round loop: drives one request's round program across the drafter and target actors.

The round is ``specdec.engine.rounds.RoundProgram``, the very program the engine drives (the
same limit, truncation, finishing and stats), so served tokens equal engine tokens; this module
answers its steps from the actors. Two ways, by whether a drafter actor serves:

- *Streamed* (no drafter actor: the target drafts itself -- n-gram, suffix -- or decodes
  plainly). The target actor runs the request's program whole (``TargetActor.rounds``), each
  round submitted there the moment the last one ends, and streams its answers (the prefill's,
  then each round's draft and verification); this loop replays them through its own program.
  Both programs are the same code on the same answers, so they ask for the same rounds; only
  this one checks stop strings (the tokeniser is here), and when it finishes first, the close
  ends the target's loop too. One actor call a request: a round never waits for a trip to the
  replica and back, and a target step never waits for requests that are away on that trip. A
  request read only at its end (not streamed, no stop strings) gets all its answers in one
  message, so the replica handles one message a request, not one a round; the time of its
  first token comes from the answers' own times.
- *Called* (a drafter actor): per round, draft on the drafter actor, which first commits the
  previous round's result (the program's ``Commit`` is held back and sent with the next draft
  call), then verify on the target actor: two actor calls.

Only token ids, stats and a few feature rows cross. Many requests run concurrently on one event
loop; the actors batch the work that waits at the same time (one target forward verifies it
all), and each answer carries the load-aware cap on the next draft, which shrinks as the batch
grows. ``reap`` frees state an actor holds for a request with no running loop (an orphan: a
loop whose ``finally`` never ran), so no path leaves state behind for longer than one reaping
period. This module knows nothing about HTTP or tokenisation.

Cleanup calls are ``detached`` from the request. In an async actor (a Serve replica) Ray counts
every actor call made in a request's context as a child of that request's task, and cancelling
the request (a client that disconnects) cancels its pending children, also those made after the
cancel, from the loop's ``finally``: a ``close`` queued behind a running round would be dropped
and the request's state leaked.
"""

from __future__ import annotations

import asyncio
import contextvars
import time
from collections import deque
from collections.abc import AsyncIterator, Callable

from actors.leases import LostState
from specdec.engine import rounds
from specdec.engine.workers import Draft

# The actors' bookkeeping reads (``active``, ``process``) run in a concurrency group of their
# own, one thread beside the one that runs model calls, so a read answers at once instead of
# queueing behind every round already submitted. ``cluster.app`` declares the group.
CONTROL_GROUP = "control"


def control(method):
    """``method`` of an actor handle, called in the control group."""
    return method.options(concurrency_group=CONTROL_GROUP)


def detached(fn, *args) -> None:
    """Run ``fn(*args)`` soon on the running loop, in an empty context: actor calls it makes
    belong to no request, so no request's cancellation cancels them. Outside a loop (a round
    loop finalised at shutdown) there is no request to detach from: it runs at once."""
    try:
        loop = asyncio.get_running_loop()
    except RuntimeError:
        fn(*args)
        return
    loop.call_soon(fn, *args, context=contextvars.Context())


class Orchestrator:
    def __init__(self, target_actor, drafter_actor, eos_token_ids: frozenset[int], observer=None):
        self.target_actor = target_actor  # Ray actor handle of a TargetActor
        # of a DrafterActor, or None: the target runs each request whole (module docstring)
        self.drafter_actor = drafter_actor
        self.eos = eos_token_ids
        # optional: .round(draft, result, seconds), .finished(program), and for the target's
        # batching .step(StepInfo) once per step and .queued(seconds) once per target call
        self.observer = observer
        self.seen_steps: deque[int] = deque(maxlen=256)  # recent target steps already observed
        self.live: set[str] = set()  # requests whose loop is running

    async def run(self, rid: str, program: rounds.RoundProgram, incremental: bool = True,
                  first_token: Callable[[float], None] | None = None
                  ) -> AsyncIterator[list[int]]:
        """Drive ``program`` over the actors; yield each round's newly committed tokens. State
        is freed in both actors however the loop ends (finish, error, or the caller cancelling
        it mid-round). ``incremental``: the caller reads the tokens as they come (a streamed
        response; stop strings, which only this loop's program checks); False: only the whole
        answer counts, so a request the target runs whole comes back in one message at the end
        (``TargetActor.rounds``' ``every=0``). ``first_token(at)``: called once, with the time
        (``time.perf_counter``) the first tokens were committed, sent or not."""
        t0 = time.perf_counter()
        self.live.add(rid)
        steps = program.steps(self.eos)
        stream = None
        if self.drafter_actor is None:
            stream = Streamed(self.target_actor, rid, every=1 if incremental else 0)
        finished = False
        try:
            step, answer, commit, t1 = next(steps), None, None, t0
            verified = None  # the streamed round whose draft answered the last Propose
            ready = None  # when the streamed round of the next Emit was answered, on our clock
            while not isinstance(step, rounds.Finish):
                match step:
                    case rounds.Open() if stream is not None:
                        opened = await stream.start(step.prompt_ids, step.params)
                        self._observe(opened.step)
                        answer = opened.answer()
                    case rounds.Open():
                        answer = await self._open(rid, step)
                    case rounds.Propose(limit) if stream is not None:
                        t1 = time.perf_counter()
                        verified = await stream.next()
                        ready = stream.ready_at(verified)
                        if len(verified.draft.tokens) > limit:  # the two programs differ
                            raise RuntimeError(f"request {rid}: the target drafted "
                                               f"{len(verified.draft.tokens)} tokens, past "
                                               f"this round's limit of {limit}")
                        answer = verified.draft
                    case rounds.Propose(limit):
                        t1 = time.perf_counter()
                        answer = await self._draft(rid, limit, commit)
                        commit = None
                    case rounds.Verify(draft) if verified is not None:
                        self._observe_round(draft, verified, t1)
                        answer, verified = verified.answer(), None
                    case rounds.Verify(draft):
                        answer = await self._verify(rid, draft, t1)
                    case rounds.Commit():
                        answer, commit = None, step  # sent with the next draft call
                    case rounds.Emit(tokens):
                        program.stats.total_s = time.perf_counter() - t0
                        answer = None
                        if first_token is not None and tokens:
                            first_token(time.perf_counter() if ready is None else ready)
                            first_token = None
                        yield tokens
                step = steps.send(answer)
            finished = True
        finally:
            # A request the target ran whole to the same end frees itself there; any other
            # end (a stop string, an error, a caller that left) needs the close.
            if not (finished and stream is not None and program.stops is None):
                self.close(rid)
            self.live.discard(rid)
            program.stats.total_s = time.perf_counter() - t0
            if self.observer is not None:
                self.observer.finished(program)

    async def _open(self, rid: str, step: rounds.Open) -> rounds.Opened:
        opened = await self.target_actor.open.remote(rid, step.prompt_ids, step.params)
        t0 = time.perf_counter()
        await self.drafter_actor.open.remote(rid, step.prompt_ids, opened.features, step.params)
        self._observe(opened.step)
        return opened.answer(drafter_s=time.perf_counter() - t0)

    async def _draft(self, rid: str, limit: int, commit: rounds.Commit | None) -> Draft:
        return await self.drafter_actor.draft.remote(rid, limit, commit)

    async def _verify(self, rid: str, draft: Draft, t_round: float) -> rounds.Verified:
        verified = await self.target_actor.verify.remote(rid, draft)
        self._observe_round(draft, verified, t_round)
        return verified.answer()

    def _observe_round(self, draft: Draft, verified, t_round: float) -> None:
        if self.observer is not None:
            self.observer.round(draft, verified.result, time.perf_counter() - t_round)
        self._observe(verified.step)

    def _observe(self, info) -> None:
        if self.observer is None or info is None:
            return
        self.observer.queued(info.queue_s)
        if info.step not in self.seen_steps:  # every request of a step reports it
            self.seen_steps.append(info.step)
            self.observer.step(info)

    def close(self, rid: str) -> None:
        """Free the request in both actors, soon and ``detached`` from any request. Fire and
        forget: each actor runs the close after any call of this request already submitted to
        it, so nothing leaks."""
        detached(self._close_now, rid)

    def _close_now(self, rid: str) -> None:
        self.target_actor.close.remote(rid)
        if self.drafter_actor is not None:
            self.drafter_actor.close.remote(rid)

    async def reap(self) -> list[str]:
        """Close every request an actor holds state for that has no running loop; return them.
        A request seen in an actor was opened, so it joined ``live`` before; if it has left
        ``live`` since, its loop ended and a second close is harmless."""
        held = set(await control(self.target_actor.active).remote())
        if self.drafter_actor is not None:
            held |= set(await control(self.drafter_actor.active).remote())
        orphans = sorted(held - self.live)
        for rid in orphans:
            self.close(rid)
        return orphans


class Streamed:
    """The answers of one request the target actor runs whole (``TargetActor.rounds``), in the
    order its program asks for them: ``start`` the ``Opened``, then ``next`` each round's
    ``Verified`` (its ``draft`` the round's draft), ``every`` to a message (0: all at the end)."""

    def __init__(self, target_actor, rid: str, every: int = 1):
        self.target_actor, self.rid, self.every = target_actor, rid, every
        self.messages = None  # Ray's ObjectRefGenerator of the actor's ``rounds``
        self.answers: deque = deque()  # those of the last message not yet asked for
        self.t0 = 0.0  # when the call went out, on this loop's clock

    async def start(self, prompt_ids: list[int], params):
        self.t0 = time.perf_counter()
        self.messages = self.target_actor.rounds.options(num_returns="streaming").remote(
            self.rid, prompt_ids, params, self.every)
        return await self.next()

    async def next(self):
        if not self.answers:
            try:
                ref = await self.messages.__anext__()
            except StopAsyncIteration:  # its loop ended before this program finished
                raise LostState(f"request {self.rid}: the target actor closed it (idle past "
                                "the TTL, or its state was freed); retry the request") from None
            self.answers.extend(await ref)
        return self.answers.popleft()

    def ready_at(self, answer) -> float:
        """When ``answer`` was ready on the actor, on this loop's clock (the call's start plus
        the actor's time since it began the call: a clock of one machine either way)."""
        return self.t0 + answer.at_s
