"""The drafter side of served speculative decoding: a plain class that Ray runs as an actor.

It loads the drafter (and the PACER pre-verifier, which runs here next to the drafter's hidden
states) from references and wraps ``specdec.engine.workers.DraftWorker``, the same code the
single-process engine runs. Its caller is the target actor (``actors.target``), which runs each
request's rounds. Per-request drafter state is keyed by request id and freed on finish, error,
cancel (the target's close) or idle TTL. One call per round: commit the previous round's result
(if any), then draft the next one. Concurrent calls are batched by a ``DraftScheduler``: the
rounds of every waiting request run as one step (block-drafter forwards batched); the models
load, and every open and round runs, on its thread alone (``actors.scheduler``: one model
thread). It knows nothing about Ray or HTTP.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from actors.host import RequestHost
from actors.leases import Leases, require_state
from actors.scheduler import BatchingConfig, DraftCall, DraftScheduler
from specdec.engine.loading import load_drafter_side, load_preverifier
from specdec.engine.rounds import Commit
from specdec.engine.settings import GenerationParams
from specdec.engine.workers import Draft, DraftWorker, OpenRequest
from specdec.models.registry import resolve_model_ref
from specdec.models.suffix import SuffixConfig


@dataclass(frozen=True)
class DrafterInfo:
    vocab_size: int
    threads: int


class DrafterActor(RequestHost):
    def __init__(self, drafter_ref: str, target_ref: str, preverifier_ref: str | None = None,
                 dtype: str = "float32", threads: int = 1, idle_ttl_s: float = 600.0,
                 device: str = "cpu", suffix: dict | None = None, block_drafter: str | None = None,
                 batching: dict | None = None):
        torch.set_num_threads(threads)  # Ray sets OMP_NUM_THREADS=1 for fractional CPU shares
        # models:/NAME@ALIAS references download from the MLflow registry on this node
        drafter_ref, target_ref, preverifier_ref = (
            resolve_model_ref(r) for r in (drafter_ref, target_ref, preverifier_ref))
        # suffix / hybrid: a restarted actor starts again from the offline index
        suffix_config = SuffixConfig(**suffix) if suffix else None

        def build() -> DraftWorker:  # on the scheduler's thread, the one model thread
            drafter = load_drafter_side(drafter_ref, target_ref, dtype, device, suffix_config,
                                        block_drafter, preverifier_ref)
            if drafter is None:
                raise ValueError("a drafter actor needs a drafter; serve drafter=none without one")
            return DraftWorker(drafter, load_preverifier(preverifier_ref, drafter))

        self.scheduler = DraftScheduler(build, BatchingConfig.from_dict(batching))
        self.worker = self.scheduler.worker
        self.leases = Leases(idle_ttl_s)

    def info(self) -> DrafterInfo:
        return DrafterInfo(self.worker.draft_model.vocab_size, torch.get_num_threads())

    def open(self, rid: str, prompt_ids: list[int], features, params: GenerationParams) -> None:
        self.sweep()
        future = self.scheduler.open(rid, OpenRequest(prompt_ids, params), features)
        self._guarded(rid, future.result)

    def draft(self, rid: str, limit: int, commit: Commit | None = None) -> Draft:
        """Commit the previous round (when given), then draft up to ``limit`` tokens."""
        require_state(self.worker.requests, rid)
        self.leases.touch(rid)
        call = DraftCall.after(limit, commit)
        return self._guarded(rid, lambda: self.scheduler.draft(rid, call).result().value)


