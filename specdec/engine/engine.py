"""The single-process engine: prefill, then rounds of draft -> pre-verify -> verify -> commit.

This is the reference path: the served path runs the same round through the same workers, as
Ray actors, and must produce the same tokens. Plain autoregressive decoding (no drafter) runs
through the same loop with empty drafts, so it is the baseline that every speedup is measured
against. The engine knows nothing about tokenisation or HTTP.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Iterator
from dataclasses import dataclass

from specdec.engine.logprobs import TokenLogprobs
from specdec.engine.settings import GenerationParams
from specdec.engine.stats import RequestStats
from specdec.engine.stops import StopStrings
from specdec.engine.workers import Draft, DraftWorker, OpenRequest, RoundResult, TargetWorker
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


def truncate(tokens: list[int], budget: int, eos: frozenset[int]) -> tuple[list[int], str | None]:
    """Cut a round's committed tokens at the first EOS or at the token budget."""
    for i, token in enumerate(tokens[:budget]):
        if token in eos:
            return tokens[: i + 1], "stop"
    if len(tokens) >= budget:
        return tokens[:budget], "length"
    return tokens, None


class Progress:
    """The bookkeeping half of a round, shared by the engine and the served orchestrator.

    It decides how long the next draft may be and settles what a verify pass committed (stats,
    EOS / stop / budget truncation, finish reason). Whoever moves the tokens (local workers
    here, Ray actors in ``cluster/``) calls ``limit`` before drafting and ``settle`` after
    verifying, so both paths commit exactly the same tokens. A round that runs past a stop
    token or stop string is cut there as at EOS; the stats count only the tokens kept.
    """

    def __init__(self, prompt_ids: list[int], params: GenerationParams,
                 stops: StopStrings | None = None):
        self.params = params
        self.prompt_ids = list(prompt_ids)
        self.stops = stops
        self.token_ids: list[int] = []
        self.logprobs: list[TokenLogprobs] = []  # one part per round, when params.logprobs is set
        self.finish_reason: str | None = None
        self.stats = RequestStats()

    def opened(self, target_s: float, drafter_s: float = 0.0) -> None:
        """Account for the prefill (one target pass)."""
        self.stats.target_s += target_s
        self.stats.drafter_s += drafter_s
        self.stats.target_passes += 1

    def limit(self, room: int) -> int:
        """Longest draft for the next round; the bonus token always comes on top of it."""
        return min(self.params.max_new_tokens - len(self.token_ids) - 1, room)

    def drafted(self, draft: Draft) -> None:
        self.stats.drafter_s += draft.drafter_s
        self.stats.preverifier_s += draft.preverifier_s
        if draft.source is not None:
            self.stats.draft_sources[draft.source] += 1

    def settle(self, draft: Draft, result: RoundResult, room: int, eos: frozenset[int]) -> list[int]:
        """Record a verified round; return the tokens it added. ``room`` is the one the draft
        was limited by; after this, ``finish_reason`` is set once the request is done."""
        budget = self.params.max_new_tokens - len(self.token_ids)
        self.stats.target_s += result.target_s
        self.stats.record_round(len(draft.tokens), result.accepted, result.regret, result.exceptions,
                                result.passes)
        new, reason = truncate(result.tokens, budget, eos | self.params.stop_token_ids)
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

    def all_logprobs(self) -> TokenLogprobs | None:
        """The kept tokens' log probabilities, when the request asked for them."""
        return None if self.params.logprobs is None else TokenLogprobs.concat(self.logprobs)


class Generation(Progress):
    """A streaming request: iterate for lists of newly committed tokens; then read the results."""

    def __init__(self, engine: Engine, rid: str, prompt_ids: list[int], params: GenerationParams,
                 stops: StopStrings | None = None):
        super().__init__(prompt_ids, params, stops)
        self.engine, self.rid = engine, rid
        self._rounds = self._run()

    def __iter__(self) -> Iterator[list[int]]:
        return self._rounds

    def _run(self) -> Iterator[list[int]]:
        engine, rid = self.engine, self.rid
        t0 = time.perf_counter()
        try:
            engine.open(rid, self.prompt_ids, self.params, self)
            while self.finish_reason is None:
                new = engine.round(rid, self)
                self.stats.total_s = time.perf_counter() - t0
                if new:
                    yield new
        finally:
            engine.close(rid)
            self.stats.total_s = time.perf_counter() - t0

    def result(self) -> Output:
        for _ in self:
            pass
        return Output(self.token_ids, self.finish_reason or "length", self.stats,
                      self.all_logprobs())


class Engine:
    """One process, one target, at most one drafter (None = plain autoregressive decoding)."""

    _ids = itertools.count()

    def __init__(self, target: TargetModel, drafter: Drafter | None = None, preverifier=None):
        check_pair(target, drafter)
        self.target = TargetWorker(target, features=bool(drafter and drafter.needs_target_features))
        self.drafter = DraftWorker(drafter, preverifier) if drafter is not None else None
        self.eos = target.eos_token_ids

    def stream(self, prompt_ids: list[int], params: GenerationParams | None = None,
               stops: StopStrings | None = None) -> Generation:
        params = params or GenerationParams()
        check_prompt(prompt_ids, self.target.target)
        return Generation(self, f"local-{next(self._ids)}", prompt_ids, params, stops)

    def generate(self, prompt_ids: list[int], params: GenerationParams | None = None,
                 stops: StopStrings | None = None) -> Output:
        return self.stream(prompt_ids, params, stops).result()

    # ---- one request's lifecycle ------------------------------------------------------------
    def open(self, rid: str, prompt_ids: list[int], params: GenerationParams, gen: Progress):
        t0 = time.perf_counter()
        features = self.target.open({rid: OpenRequest(prompt_ids, params)})[rid]
        t1 = time.perf_counter()
        if self.drafter is not None:
            self.drafter.open(rid, prompt_ids, features, params)
        gen.opened(target_s=t1 - t0, drafter_s=time.perf_counter() - t1)

    def round(self, rid: str, gen: Progress) -> list[int]:
        """Draft, verify, commit; return the tokens this round added to the output."""
        room = self.target.room(rid)
        draft = self._draft(rid, gen.limit(room), gen)
        result = self.target.verify({rid: draft})[rid]
        new = gen.settle(draft, result, room, self.eos)
        if gen.finish_reason is None and self.drafter is not None:
            t0 = time.perf_counter()
            self.drafter.commit(rid, result, len(draft.tokens))
            gen.stats.drafter_s += time.perf_counter() - t0
        return new

    def _draft(self, rid: str, limit: int, gen: Progress) -> Draft:
        if self.drafter is None or limit < 1:
            return Draft([], None)
        draft = self.drafter.draft(rid, limit)
        gen.drafted(draft)
        return draft

    def close(self, rid: str) -> None:
        self.target.close(rid)
        if self.drafter is not None:
            self.drafter.close(rid)
