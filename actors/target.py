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

It knows nothing about Ray, HTTP or tokenisation; ``cluster/`` applies ``ray.remote``.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch

from actors.host import RequestHost
from actors.leases import Leases, require_state
from actors.scheduler import BatchingConfig, DraftCall, StepInfo, TargetScheduler
from specdec.engine.loading import load_drafter, load_target, target_taps
from specdec.engine.rounds import Commit
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
    drafts: bool = False  # it runs the drafter itself: rounds go to ``round``, not ``verify``


@dataclass(frozen=True)
class Opened:
    features: torch.Tensor | None  # [len(prompt) - 1, F] taps for a block drafter, else None
    room: int  # draft tokens the context has room for in the first round
    target_s: float
    draft_cap: int | None = None  # load-aware cap on the next draft (None: none)
    step: StepInfo | None = None


@dataclass(frozen=True)
class Verified:
    result: RoundResult
    room: int  # draft tokens the context has room for in the next round
    draft_cap: int | None = None  # load-aware cap on the next draft (None: none)
    step: StepInfo | None = None
    draft: Draft | None = None  # the draft it verified, when this actor drafted it (``round``)


class TargetActor(RequestHost):
    def __init__(self, target_ref: str, drafter_ref: str = "none", dtype: str = "float32",
                 threads: int = 1, idle_ttl_s: float = 600.0, device: str = "cpu",
                 kv_slots: int = 8, batching: dict | None = None, local_drafter: dict | None = None,
                 attention: str = "auto"):
        torch.set_num_threads(threads)  # Ray sets OMP_NUM_THREADS=1 for fractional CPU shares
        # models:/NAME@ALIAS references download from the MLflow registry on this node
        target_ref, drafter_ref = resolve_model_ref(target_ref), resolve_model_ref(drafter_ref)

        def build() -> TargetWorker:  # on the scheduler's thread, the one model thread
            target = load_target(target_ref, drafter_ref, dtype, device, kv_slots,
                                 attention=attention)
            return TargetWorker(target, features=bool(target_taps(drafter_ref)))

        self.scheduler = TargetScheduler(build, BatchingConfig.from_dict(batching),
                                         drafter_builder(local_drafter, dtype))
        self.worker = self.scheduler.worker
        self.leases = Leases(idle_ttl_s)

    def info(self) -> TargetInfo:
        t = self.worker.target_model
        return TargetInfo(t.max_length, t.vocab_size, t.eos_token_ids, torch.get_num_threads(),
                          self.scheduler.drafter is not None)

    def active(self) -> list[str]:
        drafter = self.scheduler.drafter
        return sorted(set(self.worker.requests) | set(drafter.requests if drafter else ()))

    def open(self, rid: str, prompt_ids: list[int], params: GenerationParams) -> Opened:
        self.sweep()
        t0 = time.perf_counter()
        done = self._guarded(rid, self._wait, self.scheduler.open(rid, OpenRequest(prompt_ids, params)))
        return Opened(done.value, done.room, time.perf_counter() - t0, done.draft_cap, done.info)

    def verify(self, rid: str, draft: Draft) -> Verified:
        require_state(self.worker.requests, rid)
        done = self._guarded(rid, self._wait, self.scheduler.verify(rid, draft))
        return Verified(done.value, done.room, done.draft_cap, done.info)

    def round(self, rid: str, limit: int, commit: Commit | None = None) -> Verified:
        """With the drafter on this actor: commit the previous round (when given), draft up to
        ``limit`` tokens and verify them, in one step."""
        require_state(self.worker.requests, rid)
        call = DraftCall.after(limit, commit)
        done = self._guarded(rid, lambda: self.scheduler.round(rid, call).result())
        draft, result = done.value
        return Verified(result, done.room, done.draft_cap, done.info, draft)

    @staticmethod
    def _wait(future):
        return future.result()


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
