"""The target side of served speculative decoding: a plain class that Ray runs as an actor.

It loads the target model from a reference and wraps ``specdec.engine.workers.TargetWorker``,
the same code the single-process engine runs, so served tokens equal engine tokens. It holds
every request's KV cache and ASD ledger by request id, frees them on finish, error, cancel or
idle TTL, and returns only token ids, stats and a few feature rows (never logits).

Calls run concurrently (Ray gives the actor a thread per call in flight); each submits its
work to the ``TargetScheduler``, which verifies every waiting request's draft (and prefills
new prompts, chunked) in one ragged forward: continuous batching. The model loads and runs on
the scheduler's thread alone (``actors.scheduler``: one model thread).

A drafter without a model (n-gram, suffix: lookups, no forward) may run here too
(``local_drafter``): then one ``round`` call commits the previous round, drafts and verifies,
in one step, with no drafter actor between two target steps. The drafting is the same
``DraftWorker`` code, so the tokens are too.

A request that needs no drafter actor (this actor drafts, or it decodes plainly) may also run
here whole (``rounds``): its round program runs on this actor, each round submitted the moment
the last one ends, and the answers stream to the caller (a message a round, or all in one at the
end), which replays them through its own program. A round then never waits for a trip to the caller and back, and a step never waits
for requests that are away on that trip.

It knows nothing about Ray, HTTP or tokenisation; ``cluster/`` applies ``ray.remote``.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace

import torch

from actors.host import RequestHost
from actors.leases import Leases, require_state
from actors.scheduler import BatchingConfig, DraftCall, StepInfo, TargetScheduler
from specdec.engine import rounds
from specdec.engine.loading import load_drafter, load_target, target_taps
from specdec.engine.settings import GenerationParams
from specdec.engine.workers import Draft, DraftWorker, OpenRequest, RoundResult, TargetWorker
from specdec.models.drafters import runs_no_model
from specdec.models.registry import resolve_model_ref
from specdec.models.suffix import SuffixConfig


@dataclass(frozen=True)
class TargetInfo:
    max_length: int  # context length in tokens
    vocab_size: int
    eos_token_ids: frozenset[int]
    threads: int  # torch threads the actor runs on
    plan: dict | None = None  # the runtime's resolved plan (``Plan.to_dict``); None: transformers


@dataclass(frozen=True)
class Opened:
    features: torch.Tensor | None  # [len(prompt) - 1, F] taps for a block drafter, else None
    room: int  # draft tokens the context has room for in the first round
    target_s: float
    draft_cap: int | None = None  # load-aware cap on the next draft (None: none)
    step: StepInfo | None = None
    at_s: float | None = None  # ``rounds`` only: when it was ready, from the start of the call

    def answer(self, drafter_s: float = 0.0) -> rounds.Opened:
        """The round program's answer to its ``Open``."""
        return rounds.Opened(self.room, self.target_s, drafter_s, self.draft_cap)


@dataclass(frozen=True)
class Verified:
    result: RoundResult
    room: int  # draft tokens the context has room for in the next round
    draft_cap: int | None = None  # load-aware cap on the next draft (None: none)
    step: StepInfo | None = None
    draft: Draft | None = None  # the draft it verified
    at_s: float | None = None  # ``rounds`` only: when it was ready, from the start of the call

    def answer(self) -> rounds.Verified:
        """The round program's answer to its ``Verify``."""
        return rounds.Verified(self.result, self.room, self.draft_cap)


class TargetActor(RequestHost):
    def __init__(self, target_ref: str, drafter_ref: str = "none", dtype: str = "float32",
                 threads: int = 1, idle_ttl_s: float = 600.0, device: str = "cpu",
                 kv_slots: int = 8, batching: dict | None = None, local_drafter: dict | None = None,
                 attention: str = "auto", linears: str = "auto", kv_cache_dtype: str = "auto",
                 max_model_len: int | None = None, backend: str = "auto", isa: str = "auto"):
        torch.set_num_threads(threads)  # Ray sets OMP_NUM_THREADS=1 for fractional CPU shares
        # models:/NAME@ALIAS references download from the MLflow registry on this node
        target_ref, drafter_ref = resolve_model_ref(target_ref), resolve_model_ref(drafter_ref)

        def build() -> TargetWorker:  # on the scheduler's thread, the one model thread
            target = load_target(target_ref, drafter_ref, dtype, device, kv_slots,
                                 attention=attention, linears=linears,
                                 kv_cache_dtype=kv_cache_dtype, max_model_len=max_model_len,
                                 backend=backend, isa=isa)
            return TargetWorker(target, features=bool(target_taps(drafter_ref)))

        self.scheduler = TargetScheduler(build, BatchingConfig.from_dict(batching),
                                         drafter_builder(local_drafter, dtype))
        self.worker = self.scheduler.worker
        self.leases = Leases(idle_ttl_s)

    def info(self) -> TargetInfo:
        t = self.worker.target_model
        return TargetInfo(t.max_length, t.vocab_size, t.eos_token_ids, torch.get_num_threads(),
                          None if t.plan is None else t.plan.to_dict())

    def active(self) -> list[str]:
        drafter = self.scheduler.drafter
        return sorted(set(self.worker.requests) | set(drafter.requests if drafter else ()))

    def open(self, rid: str, prompt_ids: list[int], params: GenerationParams) -> Opened:
        return self._opening(rid, prompt_ids, params)()

    def verify(self, rid: str, draft: Draft) -> Verified:
        return self._verifying(rid, draft)()

    def round(self, rid: str, limit: int, commit: rounds.Commit | None = None) -> Verified:
        """With the drafter on this actor: commit the previous round (when given), draft up to
        ``limit`` tokens and verify them, in one step."""
        return self._rounding(rid, limit, commit)()

    def rounds(self, rid: str, prompt_ids: list[int], params: GenerationParams,
               every: int = 1) -> Iterator[list[Opened | Verified]]:
        """The request's whole life on this actor, for a request that needs no drafter actor
        (this actor drafts, or it decodes plainly): the request's ``RoundProgram`` runs here,
        each round submitted the moment the last one is answered, with no trip to the caller
        between two. Yields the answers in order, ``every`` to a message (0: all in one, at the
        end), the ``Opened``, then each round's ``Verified`` with the draft it verified; each
        message goes out once the next round is submitted, so its trip overlaps that round.
        Each answer carries ``at_s``, when it was ready here, from the start of this call.

        The caller replays them through its own program of the request: the same program, so
        the same rounds, and only the caller's can end at a stop string (it holds the
        tokeniser), so it closes the request when its program finishes first. Here the loop
        ends when this program finishes (its state is freed at once: no step waits for it) or
        once the request is closed; closed by the caller, it ends quietly. A caller that reads
        tokens only at the end (no streaming, no stop strings) takes ``every=0``: one message a
        request instead of one a round, for the actor and the caller alike."""
        if every < 0:
            raise ValueError(f"every must be >= 0 (0: all answers at the end), got {every}")
        batch = []
        for answer in self._answers(rid, prompt_ids, params, time.perf_counter()):
            batch.append(answer)
            if len(batch) == every:
                yield batch
                batch = []
        if batch:
            yield batch

    def _answers(self, rid: str, prompt_ids: list[int], params: GenerationParams, t0: float
                 ) -> Iterator[Opened | Verified]:
        """``rounds``' answers one by one, each yielded once the next round is submitted."""
        program = rounds.RoundProgram(prompt_ids, params)
        steps = program.steps(self.worker.target_model.eos_token_ids)
        drafts = self.scheduler.drafter is not None
        step, commit, last = next(steps), None, None  # last: the latest answer, not yet sent
        try:
            while not isinstance(step, rounds.Finish):
                answer = None
                match step:
                    case rounds.Open():
                        last = yield from sent_then(last, self._opening(rid, prompt_ids, params),
                                                    t0)
                        answer = last.answer()
                    case rounds.Propose(limit) if drafts:
                        last = yield from sent_then(last, self._rounding(rid, limit, commit), t0)
                        answer, commit = last.draft, None
                    case rounds.Propose():
                        answer = Draft([], None)  # plain decoding
                    case rounds.Verify(draft) if not drafts:
                        last = yield from sent_then(last, self._verifying(rid, draft), t0)
                        answer = last.answer()
                    case rounds.Verify():
                        answer = last.answer()  # the round verified what it drafted
                    case rounds.Commit():
                        commit = step  # sent with the next round
                step = steps.send(answer)
            yield last
        except LookupError:  # Closed, LostState: the caller closed it, or nothing to report to
            if rid not in self.scheduler.closed:
                raise
        finally:
            self.close(rid)

    # ---- each call in two halves: submit the work, then wait for its answer -----------------
    def _opening(self, rid: str, prompt_ids: list[int], params: GenerationParams
                 ) -> Callable[[], Opened]:
        self.sweep()
        t0 = time.perf_counter()
        future = self.scheduler.open(rid, OpenRequest(prompt_ids, params))
        return self._answer(rid, future, lambda done: Opened(
            done.value, done.room, time.perf_counter() - t0, done.draft_cap, done.info))

    def _verifying(self, rid: str, draft: Draft) -> Callable[[], Verified]:
        require_state(self.worker.requests, rid)
        future = self.scheduler.verify(rid, draft)
        return self._answer(rid, future, lambda done: verified(done, draft, done.value))

    def _rounding(self, rid: str, limit: int, commit: rounds.Commit | None
                  ) -> Callable[[], Verified]:
        require_state(self.worker.requests, rid)
        future = self._guarded(rid, self.scheduler.round, rid, DraftCall.after(limit, commit))
        return self._answer(rid, future, lambda done: verified(done, *done.value))

    def _answer(self, rid: str, future, build: Callable) -> Callable:
        """The wait for ``future``'s ``Done``, made into an answer by ``build`` (an error frees
        the request: ``_guarded``)."""
        return lambda: build(self._guarded(rid, future.result))


def verified(done, draft: Draft, result: RoundResult) -> Verified:
    """A verified round's answer, from the scheduler's ``Done`` of it."""
    return Verified(result, done.room, done.draft_cap, done.info, draft)


def sent_then(last, answer: Callable, t0: float):
    """Within ``TargetActor.rounds``: yield the previous answer (if any) now that the next work
    is submitted, then wait for that work's ``answer``, stamped with when it came (``at_s``,
    from ``t0``)."""
    if last is not None:
        yield last
    return replace(answer(), at_s=time.perf_counter() - t0)


def drafter_builder(spec: dict | None, dtype: str):
    """How the target actor builds the drafter it runs itself, for ``spec`` = {"drafter": a
    drafter without a model (n-gram, suffix), "suffix": its SuffixConfig fields}; None: none."""
    if spec is None:
        return None
    ref, suffix = spec["drafter"], spec.get("suffix")
    if not runs_no_model(ref):
        raise ValueError(f"the target runs only a drafter without a model (n-gram, suffix) "
                         f"itself, not {ref!r}")

    def build(worker: TargetWorker) -> DraftWorker:
        target = worker.target_model
        return DraftWorker(load_drafter(ref, target, dtype, SuffixConfig(**suffix) if suffix else None))

    return build
