"""The served round loop: drives one request's rounds across the drafter and target actors.

Per round: draft on the drafter actor (which first commits the previous round's result), verify
on the target actor, then settle with the engine's own ``Progress`` (the same limit, truncation
and stats code as ``specdec.engine.engine.Engine``), so served tokens equal engine tokens. Two
actor calls per round; only token ids, stats and a few feature rows cross. Many requests run
concurrently on one event loop; the actors batch the calls that wait at the same time (one
target forward verifies them all), and each answer carries the load-aware cap on the next
draft, which shrinks as the batch grows.
``reap`` frees state an actor holds for a request with no running loop (an orphan: a loop whose
``finally`` never ran), so no path leaves state behind for longer than one reaping period.
This module knows nothing about HTTP or tokenisation.

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
from collections.abc import AsyncIterator

from actors.drafter import Commit
from specdec.engine.engine import Progress
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
    def __init__(self, target, drafter, eos_token_ids: frozenset[int], observer=None):
        self.target = target  # Ray actor handle of a TargetActor
        self.drafter = drafter  # Ray actor handle of a DrafterActor, or None (plain decoding)
        self.eos = eos_token_ids
        # optional: .round(draft, result, seconds), .finished(progress), and for the target's
        # batching .step(StepInfo) once per step and .queued(seconds) once per target call
        self.observer = observer
        self.seen_steps: deque[int] = deque(maxlen=256)  # recent target steps already observed
        self.live: set[str] = set()  # requests whose loop is running

    async def run(self, rid: str, progress: Progress) -> AsyncIterator[list[int]]:
        """Yield each round's newly committed tokens; state is freed in both actors however the
        loop ends (finish, error, or the caller cancelling it mid-round)."""
        t0 = time.perf_counter()
        self.live.add(rid)
        try:
            opened = await self._open(rid, progress)
            room, cap, commit = opened.room, opened.draft_cap, None
            while progress.finish_reason is None:
                t1 = time.perf_counter()
                draft = await self._draft(rid, progress, room, cap, commit)
                verified = await self.target.verify.remote(rid, draft)
                new = progress.settle(draft, verified.result, room, self.eos)
                commit, room = Commit(verified.result, len(draft.tokens)), verified.room
                cap = verified.draft_cap
                progress.stats.total_s = time.perf_counter() - t0
                if self.observer is not None:
                    self.observer.round(draft, verified.result, time.perf_counter() - t1)
                self._observe(verified.step)
                if new:
                    yield new
        finally:
            self.close(rid)
            self.live.discard(rid)
            progress.stats.total_s = time.perf_counter() - t0
            if self.observer is not None:
                self.observer.finished(progress)

    async def _open(self, rid: str, progress: Progress):
        opened = await self.target.open.remote(rid, progress.prompt_ids, progress.params)
        t0 = time.perf_counter()
        if self.drafter is not None:
            await self.drafter.open.remote(rid, progress.prompt_ids, opened.features,
                                           progress.params)
        progress.opened(target_s=opened.target_s, drafter_s=time.perf_counter() - t0)
        self._observe(opened.step)
        return opened

    async def _draft(self, rid: str, progress: Progress, room: int, cap: int | None,
                     commit: Commit | None) -> Draft:
        if self.drafter is None:
            return Draft([], None)
        limit = progress.limit(room) if cap is None else min(progress.limit(room), cap)
        draft = await self.drafter.draft.remote(rid, limit, commit)
        progress.drafted(draft)
        return draft

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
        self.target.close.remote(rid)
        if self.drafter is not None:
            self.drafter.close.remote(rid)

    async def reap(self) -> list[str]:
        """Close every request an actor holds state for that has no running loop; return them.
        A request seen in an actor was opened, so it joined ``live`` before; if it has left
        ``live`` since, its loop ended and a second close is harmless."""
        held = set(await control(self.target.active).remote())
        if self.drafter is not None:
            held |= set(await control(self.drafter.active).remote())
        orphans = sorted(held - self.live)
        for rid in orphans:
            self.close(rid)
        return orphans
