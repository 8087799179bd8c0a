"""The target side of served speculative decoding: a plain class that Ray runs as an actor.

It loads the target model from a reference and wraps ``specdec.engine.workers.TargetWorker``,
the same code the single-process engine runs, so served tokens equal engine tokens. It holds
every request's KV cache and ASD ledger by request id, frees them on finish, error, cancel or
idle TTL, and returns only token ids, stats and a few feature rows (never logits).

A served request is one call, ``rounds``: the request's ``RoundProgram`` runs here, each round
submitted the moment the last one is answered, and what it commits streams back to the caller
(a message a round, or one at the end). The round's drafting goes where the drafter is:

- nowhere (plain decoding): every draft is empty;
- on this actor (``local_drafter``: a drafter without a model, n-gram or suffix, and its
  acceptance model if any, whose root state this actor then taps): one step commits the
  previous round, drafts and verifies (``TargetScheduler.round``);
- in a drafter actor of its own (``drafter``: a client of a ``DrafterActor``; ``cluster.app``
  gives it one that makes Ray calls): this actor opens the request there and asks it for each
  round's draft, the previous round's commit sent with that call; the drafter actor is this
  actor's callee, and a close here closes the request there too. A target that (re)starts
  frees all the drafter actor holds: the requests of a lost target process cannot go on.

Calls run concurrently (Ray gives the actor a thread per call in flight); each submits its
work to the ``TargetScheduler``, which verifies every waiting request's draft (and prefills
new prompts, chunked) in one ragged forward: continuous batching. The model loads and runs on
the scheduler's thread alone (``actors.scheduler``: one model thread); a call's thread waits for
the drafter actor, never the model thread, so the drafts of many requests meet in the drafter
actor's own scheduler. ``open`` / ``verify`` / ``round`` run one step of a request, for tools
and tests.

It knows nothing about Ray, HTTP, tokenisation or stop strings (the caller cuts at a stop string
and closes the request); ``cluster/`` applies ``ray.remote``.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Protocol

import torch

from actors.host import RequestHost
from actors.leases import Leases, require_state
from actors.scheduler import BatchingConfig, DraftCall, StepInfo, TargetScheduler
from specdec.engine import rounds
from specdec.engine.loading import load_drafter, load_target, target_taps
from specdec.engine.logprobs import TokenLogprobs
from specdec.engine.settings import GenerationParams
from specdec.engine.stats import RequestStats
from specdec.engine.workers import Draft, DraftWorker, OpenRequest, RoundResult, TargetWorker
from specdec.models.acceptance import load_acceptance
from specdec.models.drafters import DRAFTERS, runs_no_model
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
    # [len(prompt) - 1, F] taps for a block drafter or an acceptance model, else None
    features: torch.Tensor | None
    room: int  # draft tokens the context has room for in the first round
    target_s: float
    draft_cap: int | None = None  # load-aware cap on the next draft (None: none)
    step: StepInfo | None = None

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

    def answer(self) -> rounds.Verified:
        """The round program's answer to its ``Verify``."""
        return rounds.Verified(self.result, self.room, self.draft_cap)


@dataclass(frozen=True)
class RoundInfo:
    """One verified round, for the caller's metrics."""

    drafted: int  # draft tokens it verified
    accepted: int
    committed: int  # tokens it committed (accepted + the bonus), before any cut
    drafter_s: float  # drafting it, the pre-verifier included
    target_s: float


@dataclass(frozen=True)
class Progress:
    """A message of ``TargetActor.rounds``: what the request's program did since the last one."""

    tokens: list[int]  # committed (cut at EOS and the token budget), possibly none
    logprobs: TokenLogprobs | None  # theirs, when the request asks for them
    rounds: tuple[RoundInfo, ...]
    steps: tuple[StepInfo, ...]  # the target steps its work ran in (prefill chunks, rounds)
    stats: RequestStats  # the request's, so far (``total_s`` is the caller's to time)
    finish_reason: str | None  # set on the last message of a program that finished
    at_s: float | None  # when its first tokens were committed, from the start of the call


class DrafterClient(Protocol):
    """What the target asks of its drafter actor: a ``DrafterActor`` in this process, or
    ``cluster.app.RemoteDrafter``, which makes the same calls over Ray (``close`` without
    waiting)."""

    def open(self, rid: str, prompt_ids: list[int], features, params: GenerationParams): ...
    def draft(self, rid: str, limit: int, commit: rounds.Commit | None) -> Draft: ...
    def close(self, rid: str): ...
    def close_all(self): ...


class TargetActor(RequestHost):
    def __init__(self, target_ref: str, drafter_ref: str = "none", dtype: str = "float32",
                 threads: int = 1, idle_ttl_s: float = 600.0, device: str = "cpu",
                 kv_slots: int = 8, batching: dict | None = None, local_drafter: dict | None = None,
                 attention: str = "auto", linears: str = "auto", kv_cache_dtype: str = "auto",
                 max_model_len: int | None = None, backend: str = "auto", isa: str = "auto",
                 drafter: DrafterClient | None = None, threads_by_load: str = "auto"):
        torch.set_num_threads(threads)  # Ray sets OMP_NUM_THREADS=1 for fractional CPU shares
        # models:/NAME@ALIAS references download from the MLflow registry on this node
        target_ref, drafter_ref = resolve_model_ref(target_ref), resolve_model_ref(drafter_ref)
        if drafter is not None and local_drafter is not None:
            raise ValueError("a target drafts with a drafter actor or its own drafter, not both")

        # the acceptance model of the drafter this target runs: the target taps its root state
        acceptance = bool(local_drafter and local_drafter.get("acceptance"))

        def build() -> TargetWorker:  # on the scheduler's thread, the one model thread
            target = load_target(target_ref, drafter_ref, dtype, device, kv_slots,
                                 attention=attention, linears=linears,
                                 kv_cache_dtype=kv_cache_dtype, max_model_len=max_model_len,
                                 backend=backend, isa=isa, acceptance=acceptance,
                                 threads_by_load=threads_by_load)
            return TargetWorker(target, features=bool(target_taps(drafter_ref)) or acceptance)

        self.scheduler = TargetScheduler(build, BatchingConfig.from_dict(batching),
                                         drafter_builder(local_drafter, dtype))
        self.worker = self.scheduler.worker
        self.leases = Leases(idle_ttl_s)
        self.drafter = drafter  # the drafter actor's client, or None
        if drafter is not None:  # a restart: what the drafter holds was the lost process's
            drafter.close_all()

    def info(self) -> TargetInfo:
        t = self.worker.target_model
        return TargetInfo(t.max_length, t.vocab_size, t.eos_token_ids, torch.get_num_threads(),
                          None if t.plan is None else t.plan.to_dict())

    def active(self) -> list[str]:
        drafter = self.scheduler.drafter
        return sorted(set(self.worker.requests) | set(drafter.requests if drafter else ()))

    def close(self, rid: str) -> None:
        """Free the request here and on the drafter actor, if any."""
        super().close(rid)
        if self.drafter is not None:
            self.drafter.close(rid)

    def rounds(self, rid: str, prompt_ids: list[int], params: GenerationParams,
               every: int = 1) -> Iterator[Progress]:
        """Serve the request: its ``RoundProgram`` runs here, each round submitted the moment
        the last one is answered, with no trip to the caller between two. Yields what it
        commits, a ``Progress`` every ``every`` rounds (0: one at the end) and a last one when
        it finishes; a message goes out once the next round's work is submitted, so its trip
        overlaps that round. The request is freed when its program finishes (no step waits for
        it) or once it is closed (the caller's stop string, cancel or disconnect): closed, the
        loop ends quietly. A caller that reads tokens only at the end (no streaming, no stop
        strings) takes ``every=0``: one message a request instead of one a round."""
        if every < 0:
            raise ValueError(f"every must be >= 0 (0: all rounds at the end), got {every}")
        program = rounds.RoundProgram(prompt_ids, params)
        report = Report(program, time.perf_counter())
        try:
            for _ in self._run(rid, program, report):
                if every and len(report.rounds) >= every:
                    yield report.message()
            yield report.message()
        except LookupError:  # Closed, LostState: the caller closed it, or nothing to report to
            if rid not in self.scheduler.closed:
                raise
        finally:
            self.close(rid)

    def _run(self, rid: str, program: rounds.RoundProgram, report: Report) -> Iterator[None]:
        """Answer ``program``'s steps, recording them in ``report``; yields as each round begins
        (the moment to send what came before: once its first work is submitted, on this
        actor)."""
        steps = program.steps(self.worker.target_model.eos_token_ids)
        local, remote = self.scheduler.drafter is not None, self.drafter
        step, commit, verified = next(steps), None, None
        while not isinstance(step, rounds.Finish):
            answer = None
            match step:
                case rounds.Open(prompt_ids, params):
                    answer = self._open(rid, prompt_ids, params, report)
                case rounds.Propose(limit) if local:  # drafted and verified in one step
                    wait, commit = self._rounding(rid, limit, commit), None
                    yield
                    verified = wait()
                    answer = verified.draft
                case rounds.Propose(limit) if remote is not None:
                    yield
                    answer, commit = remote.draft(rid, limit, commit), None
                case rounds.Propose():
                    answer = Draft([], None)  # plain decoding
                case rounds.Verify(draft):
                    if not local:
                        wait = self._verifying(rid, draft)
                        if remote is None:
                            yield
                        verified = wait()
                    report.round(draft, verified)
                    answer = verified.answer()
                case rounds.Emit(tokens):
                    report.emit(tokens)
                case rounds.Commit():
                    commit = step  # sent with the next round
            step = steps.send(answer)

    def _open(self, rid: str, prompt_ids: list[int], params: GenerationParams,
              report: Report) -> rounds.Opened:
        """Prefill the prompt, then start the drafter actor (if any) on its features."""
        opened = self.open(rid, prompt_ids, params)
        report.steps.append(opened.step)
        if self.drafter is None:
            return opened.answer()
        t0 = time.perf_counter()
        self.drafter.open(rid, prompt_ids, opened.features, params)
        return opened.answer(drafter_s=time.perf_counter() - t0)

    # ---- one step of a request --------------------------------------------------------------
    def open(self, rid: str, prompt_ids: list[int], params: GenerationParams) -> Opened:
        return self._opening(rid, prompt_ids, params)()

    def verify(self, rid: str, draft: Draft) -> Verified:
        return self._verifying(rid, draft)()

    def round(self, rid: str, limit: int, commit: rounds.Commit | None = None) -> Verified:
        """With the drafter on this actor: commit the previous round (when given), draft up to
        ``limit`` tokens and verify them, in one step."""
        return self._rounding(rid, limit, commit)()

    # ---- each in two halves: submit the work, then wait for its answer ----------------------
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


class Report:
    """What a request's program did since its last message (``TargetActor.rounds``)."""

    def __init__(self, program: rounds.RoundProgram, t0: float):
        self.program, self.t0 = program, t0
        self._clear()

    def _clear(self) -> None:
        self.tokens: list[int] = []
        self.logprobs: list[TokenLogprobs] = []
        self.rounds: list[RoundInfo] = []
        self.steps: list[StepInfo] = []
        self.at_s: float | None = None

    def round(self, draft: Draft, verified: Verified) -> None:
        result = verified.result
        self.rounds.append(RoundInfo(len(draft.tokens), result.accepted, len(result.tokens),
                                     draft.drafter_s + draft.preverifier_s, result.target_s))
        self.steps.append(verified.step)

    def emit(self, tokens: list[int]) -> None:
        """The program committed ``tokens`` (its logprobs, when asked for, are its last part)."""
        if self.at_s is None:
            self.at_s = time.perf_counter() - self.t0
        self.tokens.extend(tokens)
        if self.program.params.logprobs is not None:
            self.logprobs.append(self.program.logprobs[-1])

    def message(self) -> Progress:
        """The message of what happened since the last one; starts the next."""
        p = self.program
        logprobs = TokenLogprobs.concat(self.logprobs) if self.logprobs else None
        message = Progress(self.tokens, logprobs, tuple(self.rounds), tuple(self.steps),
                           p.stats.snapshot(), p.finish_reason, self.at_s)
        self._clear()
        return message


def drafter_builder(spec: dict | None, dtype: str):
    """How the target actor builds the drafter it runs itself, for ``spec`` = {"drafter": a
    drafter without a model (n-gram, suffix), "suffix": its SuffixConfig fields, "acceptance":
    its acceptance model (a directory, models:/NAME@ALIAS or ``untrained``; absent: none)};
    None: none."""
    if spec is None:
        return None
    ref, suffix = spec["drafter"], spec.get("suffix")
    if not runs_no_model(ref):
        raise ValueError(f"the target runs only a drafter without a model (n-gram, suffix) "
                         f"itself, not {ref!r}")
    acceptance_ref = resolve_model_ref(spec.get("acceptance"))  # models:/ on this node

    def build(worker: TargetWorker) -> DraftWorker:
        target = worker.target_model
        drafter = load_drafter(ref, target, dtype, SuffixConfig(**suffix) if suffix else None)
        acceptance = load_acceptance(acceptance_ref, DRAFTERS.resolve(ref).name, drafter, target)
        if acceptance is not None:
            acceptance.check(target, drafter)
        return DraftWorker(drafter, acceptance=acceptance)

    return build
