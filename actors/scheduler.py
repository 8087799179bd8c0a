"""Continuous batching inside an actor: concurrent calls become work items, a step runs many.

Each piece of a request's work (the target's prefill, verify or round, the drafter's start or
round) is one work item, typed by its kind: a ``Work`` subclass that knows its cost in target
tokens, how it joins a step (its part of the worker's one batched call) and what it gets back.
A call submits an item and waits on its future; one scheduler thread gathers the queued items,
runs them as one *step* on the actor's core worker, and resolves the futures. Requests join and
leave between steps. The two schedulers differ in what a step is:

- ``TargetScheduler``: one ragged target forward (``TargetWorker.step``) over the drafts of
  running requests and prefill chunks of new ones, within a token budget. Verifies go first,
  then prefills in arrival order; a long prompt is cut into chunks, so it never stalls the
  running requests for more than one bounded step; an item left out of a step goes first in
  the next, so no request waits more than one step behind a newer one. Chunks start every
  ``token_budget`` tokens of the prompt, whatever else the step holds: a chunk that does not
  fit the budget left waits for the next step. A target that runs the drafter itself (n-gram,
  suffix) takes whole rounds (``Round``): each queued round is drafted as the step is planned,
  so the budget counts its draft's real length, and its draft is shortened to what the step's
  goodput buys (``fit_drafts``, ``actors.goodput``).
- ``DraftScheduler``: start new requests, then commit the previous rounds and draft the next
  ones of all queued requests (``DraftWorker.commit_batch`` / ``draft_batch``: block-drafter
  forwards batched). A drafter without batched forwards (suffix, n-gram) does not gather: a
  step takes what is queued at once.

*Gathering*: a step starts once every running request has work queued, or when ``max_batch``
items are queued, or once the gathering window has passed (a running request may be away:
drafting, or finished without a close yet). The window is ``gather_share`` of the last step's
duration, and at least ``gather_s``; it counts from the oldest queued item's arrival or from the
end of the last step, whichever is later. The requests of a step come back about one trip to the
other actor after it (the target's rounds drafted by a drafter actor), spread by that trip;
waiting a fraction of a step for the stragglers is cheaper than running them in a second step of
their own (a step's cost grows far slower than its rows). Counting from the step's end matters:
items that queued while a step ran would
otherwise start the next step at once, without the requests of the step just ended, and the
running requests would settle into two groups taking turns in half-full steps (measured: 8
plain-decoding clients ran in steps of 3.8 requests).

A ``close`` takes a request out at once: its queued items fail with ``Closed``, its state is
freed as soon as the step in flight (if any) ends, and later items of it are refused. The
worker's state is only touched under ``model_lock`` (steps, admissions, closes), so the
actors' control reads never race a step. Nothing here knows Ray.

*One model thread*: the scheduler thread builds the worker (loads the model) and runs every
step and every open; no other thread of the actor runs model work. PyTorch's CPU kernels run
on OpenMP, which gives each thread that starts parallel work a team of its own, and libgomp
cuts its idle threads' spin-wait to almost nothing once the process holds more OpenMP threads
than cores: a second model thread made every forward far slower
(docs/RESULTS.md#serve-defaults-chosen-by-measurement).
"""

from __future__ import annotations

import itertools
import threading
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field, replace
from typing import Any, ClassVar

from actors.goodput import Goodput, StepCost, fit_drafts
from specdec.engine.rounds import Commit
from specdec.engine.workers import Draft, DraftWorker, OpenRequest, RoundResult, TargetWorker
from specdec.runtime.batch import SHORT

TOMBSTONES = 4096  # closed request ids remembered (ids are unique; a late call finds its own)


class Closed(LookupError):
    """The request was closed (cancelled, or its client left) while its work was queued."""


@dataclass(frozen=True)
class BatchingConfig:
    """How the actors batch; ``max_batch=1`` runs one request per step (no batching)."""

    max_batch: int = 32  # requests per step
    token_budget: int = 512  # target tokens fed per step; longer prefills are chunked
    gather_s: float = 0.004  # shortest gathering window (see the module docstring)
    gather_share: float = 0.5  # the window as a share of the last step's duration, if longer
    # load-aware speculation: (batch size from, longest draft) pairs, the largest size <= the
    # number of running requests applies; empty: no cap beyond the request's own
    draft_caps: tuple[tuple[int, int], ...] = ()
    # shorten the drafts the target makes itself to the step's goodput (``actors.goodput``)
    fit_drafts: bool = True

    def __post_init__(self):
        if self.max_batch < 1 or self.token_budget < 1 or self.gather_s < 0 or self.gather_share < 0:
            raise ValueError(f"batching needs max_batch >= 1, token_budget >= 1, gather_s >= 0 "
                             f"and gather_share >= 0, got {self}")
        if any(size < 1 or cap < 1 for size, cap in self.draft_caps):
            raise ValueError(f"draft_caps entries are (batch size >= 1, cap >= 1), got "
                             f"{self.draft_caps}")

    @classmethod
    def from_dict(cls, d: dict | None) -> BatchingConfig:
        d = dict(d or {})
        caps = d.pop("draft_caps", {}) or {}
        pairs = caps.items() if isinstance(caps, dict) else caps
        return cls(**d, draft_caps=tuple(sorted((int(k), int(v)) for k, v in pairs)))

    def draft_cap(self, running: int) -> int | None:
        cap = None
        for size, limit in self.draft_caps:
            if running >= size:
                cap = limit
        return cap


@dataclass(frozen=True)
class StepInfo:
    """The step a request's work ran in, for metrics (one id per step)."""

    step: int
    batch: int  # requests in the step
    tokens: int  # target tokens it fed (0 on the drafter)
    queue_s: float  # this item's wait from arrival to the step's start
    slots_used: int  # requests holding state after the step
    seconds: float  # the step's duration


@dataclass(frozen=True)
class Done:
    """A work item's result: ``value`` (features, a ``RoundResult`` or a ``Draft``), the draft
    room of the request's context, the load-aware draft cap, and the step it ran in."""

    value: Any
    room: int
    draft_cap: int | None
    info: StepInfo


@dataclass
class Step:
    """What the items of one step hand the worker (each item adds its part), and its answer."""

    prefill: dict[str, int] = field(default_factory=dict)  # target: prompt tokens fed per request
    drafts: dict[str, Draft] = field(default_factory=dict)  # target: the drafts it verifies
    calls: dict[str, DraftCall] = field(default_factory=dict)  # drafter: rounds to run
    out: Any = None  # the worker's answer: a ``StepOutput`` (target), drafts by id (drafter)


@dataclass(eq=False)
class Work:
    """One queued piece of a request's work. A subclass per kind of work says what it costs,
    how it joins a step (``join``: its part of the worker's one batched call) and what it gets
    back (``outcome``); the loop knows no kind."""

    rid: str
    future: Future = field(default_factory=Future, init=False)
    arrived: float = field(default_factory=time.perf_counter, init=False)
    skipped: int = field(default=0, init=False)  # steps it was left out of
    completes: bool = field(default=False, init=False)  # whether its last step finishes it
    prefill: ClassVar[bool] = False  # a prompt's prefill: after the rounds, cut into chunks

    @property
    def cost(self) -> int:
        """Target tokens this item still needs fed."""
        return 0

    def portion(self, budget: int, first: bool, chunk: int) -> int | None:
        """Target tokens of it the next step takes with ``budget`` left (``first``: the step
        holds nothing yet); None: it waits for a later step."""
        return self.cost if self.cost <= budget or first else None

    def finishes(self, n: int) -> bool:
        """Whether running it ``n`` tokens far completes it (a prefill chunk may not)."""
        return True

    def join(self, loop: BatchLoop, step: Step, n: int) -> Exception | None:
        """Add this item's part to ``step`` (under ``model_lock``); an exception fails only it."""
        raise NotImplementedError

    def outcome(self, loop: BatchLoop, step: Step):
        """Its (value, room) once the step ran, an exception, or None (not finished yet)."""
        raise NotImplementedError


def gone(rid: str, requests) -> Closed | None:
    """A round of a request the worker holds no state for: it was closed."""
    return None if rid in requests else Closed(f"request {rid} has no state: it was closed")


# ---- the target's kinds of work --------------------------------------------------------------
@dataclass(eq=False)
class Prefill(Work):
    """A new request: admit it, then feed its prompt, a chunk a step."""

    request: OpenRequest
    fed: int = field(default=0, init=False)  # prompt tokens fed so far
    admitted: bool = field(default=False, init=False)
    prefill: ClassVar[bool] = True

    @property
    def cost(self) -> int:
        return len(self.request.prompt_ids) - self.fed

    def portion(self, budget: int, first: bool, chunk: int) -> int | None:
        # the prompt's next whole chunk: prompts are cut every ``chunk`` tokens, whatever else
        # a step holds, so a chunk is computed the same in every run (a batch-invariant runtime
        # relies on it); one that does not fit waits a step
        n = min(self.cost, chunk)
        return n if n <= budget or first else None

    def finishes(self, n: int) -> bool:
        return self.fed + n >= len(self.request.prompt_ids)

    def join(self, loop: TargetScheduler, step: Step, n: int) -> Exception | None:
        if not self.admitted:
            try:
                loop.worker.admit(self.rid, self.request)
            except Exception as e:  # noqa: BLE001 -- e.g. PoolFull: this request only
                return e
            self.admitted = True
        step.prefill[self.rid] = n
        self.fed += n
        return None

    def outcome(self, loop: TargetScheduler, step: Step):
        if self.rid not in step.out.opened:
            return None  # a chunk that did not finish the prompt
        return loop.opened(self.rid, self.request, step.out.opened[self.rid])


@dataclass(eq=False)
class Verify(Work):
    """One round of a request drafted elsewhere: verify its draft."""

    draft: Draft

    @property
    def cost(self) -> int:
        return len(self.draft.tokens) + 1

    def join(self, loop: TargetScheduler, step: Step, n: int) -> Exception | None:
        if error := gone(self.rid, loop.worker.requests):
            return error
        step.drafts[self.rid] = self.draft
        return None

    def outcome(self, loop: TargetScheduler, step: Step):
        return step.out.verified[self.rid], loop.worker.room(self.rid)


@dataclass(eq=False)
class Round(Verify):
    """A verify whose draft the target makes itself: commit the previous round and draft as
    the step is planned (so the budget counts the draft's real length), then verify."""

    draft: Draft | Exception | None = field(default=None, init=False)  # None: not drafted yet
    call: DraftCall

    @property
    def cost(self) -> int:
        return super().cost if isinstance(self.draft, Draft) else 0

    def join(self, loop: TargetScheduler, step: Step, n: int) -> Exception | None:
        return self.draft if isinstance(self.draft, Exception) else super().join(loop, step, n)

    def outcome(self, loop: TargetScheduler, step: Step):
        result, room = super().outcome(loop, step)
        return (self.draft, result), room


# ---- the drafter's kinds of work -------------------------------------------------------------
@dataclass(eq=False)
class Start(Work):
    """A request's start on the drafter: its prompt and the target's features of it. It runs
    as it joins, alone, so one bad request fails only itself."""

    request: OpenRequest
    features: Any  # [len(prompt) - 1, F] tensor for a block drafter, else None

    def join(self, loop: DraftScheduler, step: Step, n: int) -> Exception | None:
        try:
            loop.worker.open({self.rid: self.request}, {self.rid: self.features})
        except Exception as e:  # noqa: BLE001 -- this request only
            return e
        return None

    def outcome(self, loop: DraftScheduler, step: Step):
        return None, 0


@dataclass(eq=False)
class DraftRound(Work):
    """One drafter round: commit the previous round's result, then draft (batched)."""

    call: DraftCall

    def join(self, loop: DraftScheduler, step: Step, n: int) -> Exception | None:
        if error := gone(self.rid, loop.worker.requests):
            return error
        step.calls[self.rid] = self.call
        return None

    def outcome(self, loop: DraftScheduler, step: Step):
        value = step.out[self.rid]
        return value if isinstance(value, Exception) else (value, 0)


class BatchLoop:
    """The queue, the gathering rule, closes and the scheduler thread; subclasses say what a
    step is (``plan`` which items run and how far, ``run`` the worker's one call over them).
    ``build`` makes the worker; it runs on the scheduler thread (see *One model thread*), and
    the constructor returns once it has, raising what it raised."""

    name = "batch-loop"

    def __init__(self, build: Callable[[], Any], config: BatchingConfig):
        self.config = config
        self.cond = threading.Condition()
        self.model_lock = threading.Lock()
        self.queue: list[Work] = []
        self.running: set[str] = set()  # open requests (their next work is expected)
        self.closed: set[str] = set()  # recently closed ids: their later work is refused
        self.closed_order: deque[str] = deque()  # the same, oldest first (bounded)
        self.steps = itertools.count()
        self.last_step_s = 0.0  # the duration of the last step (it sets the gathering window)
        self.last_step_end = 0.0  # when it ended (perf_counter): the window counts from here
        self.stopped = False
        built: Future = Future()
        self.thread = threading.Thread(target=self._run, args=(build, built), name=self.name,
                                       daemon=True)
        self.thread.start()
        built.result()  # the worker is there (self.worker), or the build's error is raised

    # ---- the actor's side -------------------------------------------------------------------
    def submit(self, work: Work) -> Future:
        rid = work.rid
        with self.cond:
            if rid in self.closed:
                work.future.set_exception(Closed(f"request {rid} was closed"))
                return work.future
            self.queue.append(work)
            self.cond.notify()
        return work.future

    def close(self, rid: str, final: bool = True) -> None:
        """End the request: its queued work fails with ``Closed``, its state is freed after the
        step in flight. ``final``: its id is remembered, so later work of it is refused (a close
        that overtook the request's own open); a request freed after an error of its own is not
        remembered, and may be opened again under its id."""
        with self.cond:
            if final and rid not in self.closed:
                self.closed.add(rid)
                self.closed_order.append(rid)
                if len(self.closed_order) > TOMBSTONES:
                    self.closed.discard(self.closed_order.popleft())
            self.running.discard(rid)
            dropped = [w for w in self.queue if w.rid == rid]
            self.queue = [w for w in self.queue if w.rid != rid]
            self.cond.notify()
        for w in dropped:
            if not w.future.done():
                w.future.set_exception(Closed(f"request {rid} was closed"))
        with self.model_lock:
            self.release(rid)

    def stop(self) -> None:
        with self.cond:
            self.stopped = True
            self.cond.notify()

    # ---- the scheduler thread ---------------------------------------------------------------
    def _run(self, build: Callable[[], Any], built: Future) -> None:
        try:
            self.worker = build()
        except BaseException as e:  # noqa: BLE001 -- the constructor raises it
            built.set_exception(e)
            return
        built.set_result(None)
        self._loop()

    def _loop(self) -> None:
        while True:
            with self.cond:
                batch = self._gather()
                if batch is None:
                    return
            started = time.perf_counter()
            with self.model_lock:
                # closed between the gathering and now: never run (an admission would leak)
                gone = {w.rid: Closed(f"request {w.rid} was closed") for w, _ in batch
                        if w.rid in self.closed}
                live = [(w, n) for w, n in batch if w.rid not in gone]
                try:
                    results = {**gone, **(self.execute(live) if live else {})}
                except Exception as e:  # noqa: BLE001 -- the whole step failed: so did its items
                    results = {w.rid: e for w, _ in batch}
                    for w, _ in batch:
                        self.release(w.rid)
                slots = len(self.worker.requests)
            self._resolve(batch, results, started, time.perf_counter() - started, slots)

    def _gather(self) -> list[tuple[Work, int]] | None:
        """Wait for work and for the gathering rule; return the step's items (under cond)."""
        while not self.stopped:
            if not self.queue:
                self.cond.wait()
                continue
            opened = max(self.queue[0].arrived, self.last_step_end)
            wait = opened + self.window() - time.perf_counter()
            if self._ready() or wait <= 0:
                return self._take()
            self.cond.wait(wait)
        return None

    def window(self) -> float:
        """How long the oldest queued item may wait for the running requests' work."""
        return max(self.config.gather_s, self.config.gather_share * self.last_step_s)

    def _ready(self) -> bool:
        queued = {w.rid for w in self.queue}
        return len(queued) >= self.config.max_batch or self.running <= queued

    def _take(self) -> list[tuple[Work, int]]:
        batch = self.plan(sorted(self.queue, key=self.priority))
        chosen = {id(w) for w, _ in batch}
        for w in self.queue:
            if id(w) not in chosen:
                w.skipped += 1
        for w, n in batch:
            w.completes, w.skipped = w.finishes(n), 0
        self.queue = [w for w in self.queue if not (id(w) in chosen and w.completes)]
        return batch

    @staticmethod
    def priority(w: Work):
        return (w.skipped == 0, w.arrived)

    def _resolve(self, batch, results: dict, started: float, seconds: float, slots: int) -> None:
        step = next(self.steps)
        tokens = sum(n for _, n in batch)
        with self.cond:
            self.last_step_s, self.last_step_end = seconds, started + seconds
            for w, _ in batch:
                outcome = results.get(w.rid)
                if isinstance(outcome, Exception) or not w.completes:
                    if isinstance(outcome, Exception):
                        self.running.discard(w.rid)
                        self.queue = [q for q in self.queue if q is not w]
                    continue
                if w.rid not in self.closed:  # a close during the step has the last word
                    self.running.add(w.rid)
            cap = self.config.draft_cap(len(self.running))
        for w, _ in batch:
            outcome = results.get(w.rid)
            if w.future.done():
                continue
            if isinstance(outcome, Exception):
                w.future.set_exception(outcome)
            elif w.completes:
                value, room = outcome
                info = StepInfo(step, len(batch), tokens, started - w.arrived, slots, seconds)
                w.future.set_result(Done(value, room, cap, info))

    # ---- what a step is ---------------------------------------------------------------------
    def release(self, rid: str) -> None:
        """Free the request's state in the worker (under ``model_lock``)."""
        self.worker.close(rid)

    def plan(self, ordered: list[Work]) -> list[tuple[Work, int]]:
        """The items of the next step, from the queue in priority order, with how far each
        goes (target tokens fed); at least one item."""
        return [(w, w.cost) for w in ordered[: self.config.max_batch]]

    def execute(self, batch: list[tuple[Work, int]]) -> dict:
        """Run the step (under ``model_lock``): each item joins it, the worker runs it in one
        call (``run``), each item takes its outcome. Per request id (value, room), None (not
        finished) or an exception."""
        step, results = Step(), {}
        for w, n in batch:
            if (error := w.join(self, step, n)) is not None:
                results[w.rid] = error
        results |= self.run(step)
        for w, _ in batch:
            if w.rid not in results:
                results[w.rid] = w.outcome(self, step)
        return results

    def run(self, step: Step) -> dict[str, Exception]:
        """The worker's one call over what the items joined (``step.out`` its answer); the
        requests that failed in it alone."""
        raise NotImplementedError


class TargetScheduler(BatchLoop):
    """Steps of one ragged target forward: see the module docstring. With ``build_drafter``
    it also runs a drafter without a model (n-gram, suffix) on its own thread: a ``round``
    commits the request's previous round to it and drafts as the next step is planned (so the
    budget counts the draft's real length), then the step verifies it."""

    name = "target-scheduler"
    worker: TargetWorker

    def __init__(self, build: Callable[[], TargetWorker], config: BatchingConfig,
                 build_drafter: Callable[[TargetWorker], DraftWorker] | None = None):
        self.drafter: DraftWorker | None = None
        self.goodput: Goodput | None = None  # prices its drafts' tokens (``fit_drafts``)

        def both() -> TargetWorker:
            worker = build()
            if build_drafter is not None:
                self.drafter = build_drafter(worker)
            if config.fit_drafts and self.drafter is not None and worker.runtime is not None:
                piece = worker.piece_rows  # a batch-invariant linear's edge: measure both sides
                edges = () if piece is None else (piece, piece + 1)
                self.goodput = Goodput(StepCost.measure(worker.runtime, extra=edges))
                self.drafter.survival = True  # the goodput prices drafts by it
            return worker

        super().__init__(both, config)

    def open(self, rid: str, req: OpenRequest) -> Future:
        return self.submit(Prefill(rid, req))

    def verify(self, rid: str, draft: Draft) -> Future:
        return self.submit(Verify(rid, draft))

    def round(self, rid: str, call: DraftCall) -> Future:
        """Commit the previous round, draft and verify, in one step (needs the drafter)."""
        if self.drafter is None:
            raise ValueError("this target runs no drafter: send its drafts with verify")
        return self.submit(Round(rid, call))

    def release(self, rid: str) -> None:
        self.worker.close(rid)
        if self.drafter is not None:
            self.drafter.close(rid)

    @staticmethod
    def priority(w: Work):
        return (w.skipped == 0, w.prefill, w.arrived)

    def plan(self, ordered: list[Work]) -> list[tuple[Work, int]]:
        self._draft_rounds(ordered)  # so a round's cost is its draft's length
        budget, batch = self.config.token_budget, []
        for w in ordered:
            if len(batch) == self.config.max_batch:
                break
            n = w.portion(budget, not batch, self.config.token_budget)
            if n is not None:
                batch.append((w, n))
                budget -= n
        return self._fit(batch)

    def _fit(self, batch: list[tuple[Work, int]]) -> list[tuple[Work, int]]:
        """Shorten the drafts this target made itself, of requests whose tokens do not depend
        on them, to what the step's goodput buys (``actors.goodput.fit_drafts``: priced on the
        step's short rows, which the drafts add to; a long prompt chunk's cost is the same
        either way); as is without ``fit_drafts``."""
        g = self.goodput
        if g is None:
            return batch
        short = [(i, w, n) for i, (w, n) in enumerate(batch) if n <= SHORT]
        cut = [(i, w) for i, w, _ in short if isinstance(w, Round) and isinstance(w.draft, Draft)
               and self.worker.draft_free(w.rid)]
        drafts = [w.draft for _, w in cut]
        fixed = sum(n for _, _, n in short) - sum(len(d.tokens) for d in drafts)
        rounds = sum(not w.prefill for w, _ in batch)
        values = [g.values(len(d.tokens), d.confidence, d.survival) for d in drafts]
        keep = fit_drafts(values, fixed,
                          g.cost, g.price(rounds))
        batch = list(batch)
        for (i, w), d, k in zip(cut, drafts, keep, strict=True):
            if k < len(d.tokens):
                w.draft = head(d, k)
                batch[i] = (w, w.cost)
        return batch

    def _observe(self, drafts: dict[str, Draft], verified: dict[str, RoundResult],
                 seconds: float, prefilled: int) -> None:
        """What the step did, for the goodput: each draft's acceptance, the tokens committed and
        the rounds' and prompt chunks' tokens it fed."""
        for rid, result in verified.items():
            d = drafts[rid]
            self.goodput.round(d.confidence, len(d.tokens), result.accepted, d.survival)
        self.goodput.step(sum(len(r.tokens) for r in verified.values()), seconds,
                          fed=sum(len(d.tokens) + 1 for d in drafts.values()), prefilled=prefilled)

    def run(self, step: Step) -> dict[str, Exception]:
        started = time.perf_counter()
        step.out = self.worker.step(step.prefill, step.drafts)
        if self.goodput is not None:
            self._observe(step.drafts, step.out.verified, time.perf_counter() - started,
                          sum(step.prefill.values()))
        return dict(step.out.failed)

    def _draft_rounds(self, queued: list[Work]) -> None:
        """Draft every queued ``Round`` not drafted yet with the drafter this target runs (its
        ``draft``: the draft, or the error that fails it), before the step is planned. Called
        under ``cond``; it takes ``model_lock`` (no thread holds that lock while it waits for
        ``cond``)."""
        calls = {w.rid: w for w in queued if isinstance(w, Round) and w.draft is None}
        if not calls:
            return
        with self.model_lock:
            live = {rid: w.call for rid, w in calls.items() if rid in self.drafter.requests}
            drafted = draft_rounds(self.drafter, live)
        for rid, w in calls.items():
            w.draft = drafted[rid] if rid in drafted else Closed(
                f"request {rid} has no drafter state: it was closed")

    def opened(self, rid: str, req: OpenRequest, features):
        """A prompt fully prefilled: start the drafter this target runs on it, if any."""
        if self.drafter is not None:
            try:
                # a drafter without a model reads no features; its acceptance model, their root
                self.drafter.open({rid: req}, {rid: features})
            except Exception as e:  # noqa: BLE001 -- this request only
                return e
        return features, self.worker.room(rid)


@dataclass(frozen=True)
class DraftCall:
    """One drafter round of a request: commit the previous result (if any), then draft."""

    limit: int
    commit: tuple[RoundResult, int] | None  # (result, draft length of that round)

    @classmethod
    def after(cls, limit: int, commit: Commit | None) -> DraftCall:
        """The round after the round program's ``commit`` (None: the first round)."""
        return cls(limit, None if commit is None else (commit.result, commit.drafted))


class DraftScheduler(BatchLoop):
    """Steps of many requests' drafter rounds: opens first (each alone: one bad request fails
    only itself), then commits, then one batched draft."""

    name = "draft-scheduler"
    worker: DraftWorker

    def window(self) -> float:
        """No gathering for a drafter without batched forwards (suffix, n-gram): its requests'
        lookups cost the same in one step or in many, so a round never waits for another."""
        return super().window() if self.worker.batches else 0.0

    def open(self, rid: str, request: OpenRequest, features) -> Future:
        return self.submit(Start(rid, request, features))

    def draft(self, rid: str, call: DraftCall) -> Future:
        return self.submit(DraftRound(rid, call))

    def run(self, step: Step) -> dict[str, Exception]:
        step.out = draft_rounds(self.worker, step.calls)
        return {}


def head(draft: Draft, k: int) -> Draft:
    """The draft's first ``k`` tokens (and their proposal rows, when sampling)."""
    probs = None if draft.probs is None else draft.probs[:k]
    confidence = None if draft.confidence is None else draft.confidence[:k]
    survival = None if draft.survival is None else draft.survival[:k]
    return replace(draft, tokens=draft.tokens[:k], probs=probs, confidence=confidence,
                   survival=survival)


def draft_rounds(worker: DraftWorker, calls: dict[str, DraftCall]) -> dict:
    """Per request, commit its previous round (if any), then draft up to its limit: one batched
    commit and one batched draft. Returns each request's ``Draft``, or the exception that
    failed it alone."""
    if not calls:
        return {}
    failed = _commit_each(worker, {rid: c.commit for rid, c in calls.items()
                                   if c.commit is not None})
    limits = {rid: c.limit for rid, c in calls.items() if rid not in failed and c.limit > 0}
    drafts = _draft_each(worker, limits)
    return {rid: failed[rid] if rid in failed else drafts.get(rid, Draft([], None))
            for rid in calls}


def _commit_each(worker: DraftWorker, commits: dict) -> dict[str, Exception]:
    """One batched commit (it checks every request before it changes any); should it fail,
    each request alone, so only the bad one fails. Returns the failures."""
    try:
        worker.commit_batch(commits)
        return {}
    except Exception:  # noqa: BLE001
        failed = {}
        for rid, commit in commits.items():
            try:
                worker.commit_batch({rid: commit})
            except Exception as e:  # noqa: BLE001
                failed[rid] = e
        return failed


def _draft_each(worker: DraftWorker, limits: dict[str, int]) -> dict:
    """One batched draft; should it fail, each request alone, so only the bad one fails (a
    half-run batch may have moved some drafters' state: their next drafts may differ, never the
    committed tokens, which verification decides)."""
    if not limits:
        return {}
    try:
        return worker.draft_batch(limits)
    except Exception:  # noqa: BLE001
        drafts = {}
        for rid, limit in limits.items():
            try:
                drafts[rid] = worker.draft_batch({rid: limit})[rid]
            except Exception as e:  # noqa: BLE001
                drafts[rid] = e
        return drafts
