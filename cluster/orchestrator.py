"""The served request loop: the replica's side of one request the target actor runs.

The target actor runs the request's round program (``specdec.engine.rounds.RoundProgram``, the
very program the engine drives: the same limits, truncation, finishing and stats) in one call,
``TargetActor.rounds``, each round submitted there the moment the last one ends, and streams
what each round commits. When the drafter runs in an actor of its own, the target calls it for
each round (the drafter actor is the target's callee, never the replica's), so a round never
waits for a trip to the replica and back, and a target step never waits for requests that are
away on that trip. This loop reads the stream into a ``Served``, the replica's view of the
request (its tokens, log probabilities, stats and finish reason), cut at the first stop string
(the tokeniser is here), and feeds the metrics observer each round and target step. There is
no second copy of the program here and nothing is replayed. A request read only at its end
(not streamed, no stop strings) gets its whole answer in one message, so the replica handles
one message a request, not one a round.

Only token ids, stats and a few feature rows cross. Many requests run concurrently on one event
loop; the target batches the work that waits at the same time (one forward verifies it all).
A request whose program finished is freed by the target itself; any other end (a stop string,
an error, a caller that left or was cancelled) sends a ``close`` to the target, which closes the
request on the drafter actor too. ``reap`` frees state an actor holds for a request with no
running loop (an orphan: a loop whose ``finally`` never ran), so no path leaves state behind for
longer than one reaping period. This module knows nothing about HTTP or tokenisation.

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
from dataclasses import replace

from actors.leases import LostState
from actors.target import Progress
from specdec.engine.logprobs import TokenLogprobs
from specdec.engine.settings import GenerationParams
from specdec.engine.stats import RequestStats
from specdec.engine.stops import StopStrings

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


class Served:
    """One request as the replica sees it: what the target's program committed, cut at the
    first stop string. Read it as a ``RoundProgram``: ``token_ids``, ``finish_reason``,
    ``stats``, ``logprobs`` (a part a message that added tokens), ``all_logprobs()``."""

    def __init__(self, prompt_ids: list[int], params: GenerationParams,
                 stops: StopStrings | None = None):
        self.prompt_ids, self.params, self.stops = list(prompt_ids), params, stops
        self.token_ids: list[int] = []
        self.logprobs: list[TokenLogprobs] = []
        self.finish_reason: str | None = None
        self.stats = RequestStats()

    def add(self, progress: Progress) -> list[int]:
        """Take in a message of the target's; return the tokens it adds to the output. A stop
        string ends the request at the token that completes it, as the program ends at EOS;
        the stats count only the tokens kept."""
        new, reason = progress.tokens, progress.finish_reason
        if self.stops is not None and new:
            keep = self.stops.cut(self.token_ids + new, len(self.token_ids))
            if keep is not None:
                new, reason = new[: keep - len(self.token_ids)], "stop"
        if progress.logprobs is not None and new:
            self.logprobs.append(progress.logprobs.head(len(new)))
        self.token_ids.extend(new)
        self.stats = replace(progress.stats, committed=len(self.token_ids),
                             total_s=self.stats.total_s)
        self.finish_reason = reason
        return new

    def all_logprobs(self) -> TokenLogprobs | None:
        """The kept tokens' log probabilities, when the request asked for them."""
        return None if self.params.logprobs is None else TokenLogprobs.concat(self.logprobs)


class Orchestrator:
    def __init__(self, target_actor, drafter_actor=None, observer=None):
        self.target_actor = target_actor  # Ray actor handle of a TargetActor
        # of the target's DrafterActor, or None: read here only for ``reap``
        self.drafter_actor = drafter_actor
        # optional: .round(RoundInfo), .finished(served), and for the target's batching
        # .step(StepInfo) once per step and .queued(seconds) once per target call
        self.observer = observer
        self.seen_steps: deque[int] = deque(maxlen=256)  # recent target steps already observed
        self.live: set[str] = set()  # requests whose loop is running

    async def run(self, rid: str, served: Served, incremental: bool = True,
                  first_token: Callable[[float], None] | None = None
                  ) -> AsyncIterator[list[int]]:
        """Run the request on the target actor; yield each message's newly kept tokens. State
        is freed in the actors however the loop ends (finish, stop string, error, or the
        caller cancelling it mid-round). ``incremental``: the caller reads the tokens as they
        come (a streamed response; stop strings); False: only the whole answer counts, so it
        comes back in one message at the end (``TargetActor.rounds``' ``every=0``).
        ``first_token(at)``: called once, with the time (``time.perf_counter``) the first
        tokens were committed, sent or not."""
        t0 = time.perf_counter()
        self.live.add(rid)
        freed = False  # the target's program finished: it freed the request itself
        try:
            messages = self.target_actor.rounds.options(num_returns="streaming").remote(
                rid, served.prompt_ids, served.params, 1 if incremental else 0)
            async for ref in messages:
                progress = await ref
                freed = progress.finish_reason is not None
                new = served.add(progress)
                served.stats.total_s = time.perf_counter() - t0
                self._observe(progress)
                if new:
                    if first_token is not None:
                        first_token(t0 + progress.at_s)
                        first_token = None
                    yield new
                if served.finish_reason is not None:
                    return
            raise LostState(f"request {rid}: the target actor closed it (idle past the TTL, "
                            "or its state was freed); retry the request")
        finally:
            if not freed:
                self.close(rid)
            self.live.discard(rid)
            served.stats.total_s = time.perf_counter() - t0
            if self.observer is not None:
                self.observer.finished(served)

    def _observe(self, progress: Progress) -> None:
        if self.observer is None:
            return
        for info in progress.rounds:
            self.observer.round(info)
        for info in progress.steps:
            self.observer.queued(info.queue_s)
            if info.step not in self.seen_steps:  # every request of a step reports it
                self.seen_steps.append(info.step)
                self.observer.step(info)

    def close(self, rid: str) -> None:
        """Free the request on the target actor, which frees it on the drafter actor too; soon
        and ``detached`` from any request. Fire and forget: the target's loop of the request
        ends quietly at its next step."""
        detached(self.target_actor.close.remote, rid)

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
