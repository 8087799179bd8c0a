"""The single-process engine: the round program driven synchronously on local workers.

The round itself (prefill, then rounds of draft -> pre-verify -> verify -> commit, and every
rule about limits, truncation and finishing) is ``specdec.engine.rounds.RoundProgram``; this
module answers its steps with calls on a local ``TargetWorker`` and ``DraftWorker``. This is the
reference path: the served path drives the same program through the same workers, as Ray
actors, and must produce the same tokens. Plain autoregressive decoding (no drafter) runs
through the same loop with empty drafts, so it is the baseline that every speedup is measured
against. The engine knows nothing about tokenisation or HTTP.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Iterator
from dataclasses import dataclass

from specdec.engine import rounds
from specdec.engine.logprobs import TokenLogprobs
from specdec.engine.settings import GenerationParams
from specdec.engine.stats import RequestStats
from specdec.engine.stops import StopStrings
from specdec.engine.workers import Draft, DraftWorker, OpenRequest, TargetWorker
from specdec.models.acceptance import AcceptanceModel
from specdec.models.drafter import Drafter
from specdec.models.target import TargetModel


@dataclass(frozen=True)
class Output:
    token_ids: list[int]  # generated tokens, the prompt excluded
    finish_reason: str  # "stop" (EOS, a stop token or a stop string) or "length"
    stats: RequestStats
    logprobs: TokenLogprobs | None = None  # [len(token_ids)] rows when params.logprobs is set


def check_prompt(prompt_ids: list[int], target: TargetModel) -> None:
    if not prompt_ids:
        raise ValueError("the prompt is empty")
    if len(prompt_ids) >= target.max_length:
        raise ValueError(f"the prompt has {len(prompt_ids)} tokens; the model's context is "
                         f"{target.max_length}")
    bad = [t for t in prompt_ids if not 0 <= t < target.vocab_size]
    if bad:
        raise ValueError(f"prompt token ids {bad[:5]} are outside the vocabulary of {target.vocab_size}")


def check_pair(target: TargetModel, drafter: Drafter | None) -> None:
    if drafter is not None and drafter.vocab_size != target.vocab_size:
        raise ValueError(f"the drafter's vocabulary ({drafter.vocab_size}) does not match the "
                         f"target's ({target.vocab_size})")


class Generation:
    """A streaming request: iterate for lists of newly committed tokens; then read the results
    (``token_ids``, ``finish_reason``, ``stats``: the program's)."""

    def __init__(self, program: rounds.RoundProgram, chunks: Iterator[list[int]]):
        self.program = program
        self._chunks = chunks

    def __iter__(self) -> Iterator[list[int]]:
        return self._chunks

    @property
    def token_ids(self) -> list[int]:
        return self.program.token_ids

    @property
    def finish_reason(self) -> str | None:
        return self.program.finish_reason

    @property
    def stats(self) -> RequestStats:
        return self.program.stats

    def result(self) -> Output:
        for _ in self:
            pass
        p = self.program
        return Output(p.token_ids, p.finish_reason or "length", p.stats, p.all_logprobs())


class Engine:
    """One process, one target, at most one drafter (None = plain autoregressive decoding).

    It drives the round program (``specdec.engine.rounds``) synchronously: each step the
    program yields is answered by a call on the local ``TargetWorker`` / ``DraftWorker``."""

    _ids = itertools.count()

    def __init__(self, target_model: TargetModel, draft_model: Drafter | None = None,
                 preverifier=None, acceptance: AcceptanceModel | None = None):
        """``acceptance``: the acceptance model (``specdec.models.acceptance``), whose root
        state the target then taps (its ``tap_layers``: ``load_pair`` sets them)."""
        check_pair(target_model, draft_model)
        if acceptance is not None:
            acceptance.check(target_model, draft_model)
        features = draft_model is not None and (bool(draft_model.needs_target_features)
                                                or acceptance is not None)
        self.target_worker = TargetWorker(target_model, features)
        self.draft_worker = None if draft_model is None else DraftWorker(draft_model, preverifier,
                                                                         acceptance)
        self.eos = target_model.eos_token_ids

    def stream(self, prompt_ids: list[int], params: GenerationParams | None = None,
               stops: StopStrings | None = None) -> Generation:
        params = params or GenerationParams()
        check_prompt(prompt_ids, self.target_worker.target_model)
        program = rounds.RoundProgram(prompt_ids, params, stops)
        return Generation(program, self.run(f"local-{next(self._ids)}", program))

    def generate(self, prompt_ids: list[int], params: GenerationParams | None = None,
                 stops: StopStrings | None = None) -> Output:
        return self.stream(prompt_ids, params, stops).result()

    def run(self, rid: str, program: rounds.RoundProgram) -> Iterator[list[int]]:
        """Drive ``program`` to its end; yield each round's new tokens. The request's state is
        freed in both workers however the loop ends."""
        t0 = time.perf_counter()
        try:
            for tokens in rounds.drive(program.steps(self.eos), lambda step: self._answer(rid, step)):
                program.stats.total_s = time.perf_counter() - t0
                yield tokens
        finally:
            self.close(rid)
            program.stats.total_s = time.perf_counter() - t0

    def _answer(self, rid: str, step: rounds.Step):
        match step:
            case rounds.Open():
                return self._open(rid, step)
            case rounds.Propose(limit):
                if self.draft_worker is None or limit < 1:
                    return Draft([], None)
                return self.draft_worker.draft(rid, limit)
            case rounds.Verify(draft):
                result = self.target_worker.verify({rid: draft})[rid]
                return rounds.Verified(result, self.target_worker.room(rid))
            case rounds.Commit(result, drafted):
                if self.draft_worker is None:
                    return None
                t0 = time.perf_counter()
                self.draft_worker.commit(rid, result, drafted)
                return time.perf_counter() - t0
        return None  # Emit

    def _open(self, rid: str, step: rounds.Open) -> rounds.Opened:
        t0 = time.perf_counter()
        batch = {rid: OpenRequest(step.prompt_ids, step.params)}
        features = self.target_worker.open(batch)
        t1 = time.perf_counter()
        if self.draft_worker is not None:
            self.draft_worker.open(batch, features)
        return rounds.Opened(self.target_worker.room(rid), target_s=t1 - t0,
                             drafter_s=time.perf_counter() - t1)

    def close(self, rid: str) -> None:
        self.target_worker.close(rid)
        if self.draft_worker is not None:
            self.draft_worker.close(rid)
