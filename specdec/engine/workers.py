"""The two sides of a speculative round, each holding its requests' state by request id.

``TargetWorker`` owns the target model, every request's KV cache and ASD ledger, and runs
verification next to the logits. ``DraftWorker`` owns the drafter, the PACER pre-verifier and
every request's drafter state. Both are batch-first: a call may carry many requests (dicts keyed
by request id) and runs one model forward for all of them; one request is a batch of one. Only
token ids, a few stats and a few feature rows cross between them, never full logits, so in
serving each is a Ray actor (``actors/`` wraps these classes) and in the single-process engine
they are local objects running the same code.

Cache invariant: a request's verified sequence is S; the target caches S[:-1] and the last token
is *pending*. A round feeds [pending, x_0..x_{K-1}] in one pass (K + 1 logits rows), then crops the
cache back to the new S[:-1]. The one exception is the first round: the prefill already ran the
whole prompt (as HF ``generate`` does), so its last logits row stands in for the pending token's
and the first round feeds only the draft -- plain decoding makes no more passes than ``generate``.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, replace
from typing import Any

import torch

from specdec.algorithms.policies import DraftPolicy, make_policy
from specdec.algorithms.sampling import Sampling
from specdec.algorithms.verify import Verifier, make_verifier
from specdec.engine.logprobs import TokenLogprobs, score
from specdec.engine.settings import GenerationParams
from specdec.models.drafter import DraftBlock, Drafter
from specdec.models.target import TargetModel, TargetState


@dataclass(frozen=True)
class Draft:
    """What the drafter side sends to the target side for one round."""

    tokens: list[int]  # x_0..x_{K-1}
    probs: torch.Tensor | None  # [K, V] proposal distribution, only when sampling
    drafter_s: float = 0.0
    preverifier_s: float = 0.0
    source: str | None = None  # which draft source the tokens came from (hybrid: suffix | block)


@dataclass(frozen=True)
class RoundResult:
    """What the target side sends back: the committed tokens and the features behind them."""

    tokens: list[int]  # accepted drafts + the bonus token
    accepted: int
    regret: float
    exceptions: int
    features: torch.Tensor | None  # [accepted + 1, F] taps of the newly verified positions
    target_s: float = 0.0
    passes: int = 1  # target forwards this round ran (0: a first round with an empty draft)
    logprobs: TokenLogprobs | None = None  # [accepted + 1] rows, only when the request asks


@dataclass
class TargetRequest:
    state: TargetState
    verifier: Verifier
    generator: torch.Generator
    pending: int  # last verified token, not yet in the cache (see ``primed``)
    # Until the first round: the prefill's outputs at the pending token, which it did cache
    # (logits [1, V], taps [1, F] or None).
    primed: tuple[torch.Tensor, torch.Tensor | None] | None = None
    spent: float = 0.0  # ASD ledger: regret spent so far
    logprobs: int | None = None  # top alternatives to report per token; None: no logprobs


def generators(seed: int) -> tuple[torch.Generator, torch.Generator]:
    """Independent random streams for the drafter and target sides, from one request seed."""
    return torch.Generator().manual_seed(seed), torch.Generator().manual_seed(seed + 1)


@dataclass(frozen=True)
class OpenRequest:
    """One request to prefill: what ``TargetWorker.open`` takes per request id."""

    prompt_ids: list[int]
    params: GenerationParams


class TargetWorker:
    """Batch-first: ``open`` and ``verify`` take and return dicts keyed by request id and run
    ONE target forward for all the requests in the call (one request is a batch of one)."""

    def __init__(self, target: TargetModel, features: bool):
        self.target = target
        self.features = features  # whether the drafter needs tapped features
        self.requests: dict[str, TargetRequest] = {}

    def open(self, batch: dict[str, OpenRequest]) -> dict[str, torch.Tensor | None]:
        """Prefill each whole prompt; return per request the features of all its tokens but the
        last (the pending one) for the drafter, and keep the last token's outputs for the first
        round."""
        for rid in batch:
            if rid in self.requests:
                raise ValueError(f"request {rid!r} is already open")
        states = {}
        try:
            for rid in batch:
                states[rid] = self.target.new_state()
            outs = self.target.forward_batch(list(states.values()),
                                             [batch[rid].prompt_ids for rid in states],
                                             taps=self.features, last_logits_only=True)
        except Exception:
            for state in states.values():
                self.target.release(state)
            raise
        features = {}
        for (rid, state), out in zip(states.items(), outs, strict=True):
            req = batch[rid]
            spec = req.params.spec
            verifier = make_verifier(spec.verifier_name(req.params.temperature),
                                     **spec.verifier_params(req.params.temperature,
                                                         **req.params.warp_params()))
            _, target_gen = generators(req.params.seed)
            primed = (out.logits[-1:], None if out.taps is None else out.taps[-1:])  # on its device
            self.requests[rid] = TargetRequest(state, verifier, target_gen,
                                               pending=req.prompt_ids[-1], primed=primed,
                                               logprobs=req.params.logprobs)
            features[rid] = None if out.taps is None else out.taps[:-1].cpu()
        return features

    def verify(self, drafts: dict[str, Draft]) -> dict[str, RoundResult]:
        """Score every request's draft in one forward, then verify and crop each."""
        t0 = time.perf_counter()
        reqs = {rid: self.requests[rid] for rid in drafts}
        scored = self._score(reqs, {rid: d.tokens for rid, d in drafts.items()})
        shared = time.perf_counter() - t0  # the forward, split evenly among the requests
        results = {}
        for rid, draft in drafts.items():
            t1 = time.perf_counter()
            results[rid] = self._settle(reqs[rid], draft, *scored[rid])
            results[rid] = replace(results[rid], target_s=shared / len(drafts)
                                   + time.perf_counter() - t1)
        return results

    def _settle(self, req: TargetRequest, draft: Draft, logits, taps, passes) -> RoundResult:
        start = req.state.length - len(draft.tokens) - 1  # where the pending token sits
        # K+1 rows of logits are small next to a forward pass: verify on the CPU, where the
        # request's generator lives, whatever device the target runs on.
        verdict = req.verifier.verify(
            logits.cpu(), torch.tensor(draft.tokens, dtype=torch.long), spent=req.spent,
            draft_probs=draft.probs, generator=req.generator,
        )
        req.spent += verdict.regret
        self.target.crop(req.state, start + 1 + verdict.accepted)
        req.pending = verdict.tokens[-1]
        features = None if taps is None else taps[: verdict.accepted + 1].cpu()
        logprobs = None if req.logprobs is None else score(logits.cpu(), verdict.tokens, req.logprobs)
        return RoundResult(verdict.tokens, verdict.accepted, verdict.regret, verdict.exceptions,
                           features, 0.0, passes, logprobs)

    def _score(self, reqs: dict[str, TargetRequest], drafts: dict[str, list[int]]) -> dict:
        """Per request: target logits [K+1, V] and taps [K+1, F] (or None) at [pending, *drafts],
        and the number of forwards that took (0 or 1); afterwards the cache holds them all."""
        scored, fed = {}, {}
        for rid, req in reqs.items():
            if req.primed is None:
                fed[rid] = [req.pending, *drafts[rid]]
            elif drafts[rid]:
                fed[rid] = drafts[rid]
            else:  # a first round with an empty draft: the prefill already scored it
                scored[rid] = (*req.primed, 0)
                req.primed = None
        outs = self.target.forward_batch([reqs[rid].state for rid in fed], list(fed.values()),
                                         taps=self.features) if fed else []
        for rid, out in zip(fed, outs, strict=True):
            req = reqs[rid]
            if req.primed is None:
                scored[rid] = (out.logits, out.taps, 1)
                continue
            logits, taps = req.primed
            req.primed = None
            both = None if taps is None else torch.cat([taps, out.taps])
            scored[rid] = (torch.cat([logits, out.logits]), both, 1)
        return scored

    def room(self, rid: str) -> int:
        """Draft tokens the context still has room for in the next round."""
        req = self.requests[rid]
        verified = req.state.length + (req.primed is None)  # the pending token included
        return self.target.max_length - verified

    def close(self, rid: str) -> None:
        req = self.requests.pop(rid, None)
        if req is not None:
            self.target.release(req.state)


@dataclass
class DraftRequest:
    state: Any
    policy: DraftPolicy
    policy_state: Any
    sampling: Sampling
    timers: dict  # {"preverifier": seconds in this round's pre-verifier calls}


class DraftWorker:
    """``draft_batch`` and ``commit_batch`` take dicts keyed by request id; drafters with the
    optional ``prepare`` / ``commit_batch`` (block, hybrid) batch their forwards across the
    requests, the others (n-gram, suffix, AR) run per request. ``draft`` / ``commit`` are the
    batch of one."""

    def __init__(self, drafter: Drafter, preverifier: torch.nn.Module | None = None):
        self.drafter = drafter
        self.preverifier = preverifier
        self.requests: dict[str, DraftRequest] = {}

    def open(self, rid: str, prompt_ids: list[int], features, params: GenerationParams) -> None:
        if rid in self.requests:
            raise ValueError(f"request {rid!r} is already open")
        spec = params.spec
        if getattr(self.drafter, "pacer_inside", False) and spec.policy != "fixed":
            raise ValueError(f"policy {spec.policy} with the hybrid drafter: it runs PACER on "
                             "its block draft itself; use policy fixed (gamma caps the draft)")
        extra = {}
        timers = {"preverifier": 0.0}
        if spec.policy == "pacer":
            extra["scorer"] = self._timed_scorer(timers)
        policy = make_policy(spec.policy, **spec.policy_params(), **extra)
        draft_gen, _ = generators(params.seed)
        # drafters that read per-request settings (suffix, hybrid) get them at start
        settings = {"settings": spec} if getattr(self.drafter, "reads_settings", False) else {}
        self.requests[rid] = DraftRequest(
            self.drafter.start(prompt_ids, features, **settings), policy, policy.new_state(),
            Sampling(params.temperature, draft_gen, **params.warp_params()), timers,
        )

    def _timed_scorer(self, timers: dict):
        if self.preverifier is None:
            return None  # make_policy then says that PACER needs a pre-verifier

        def score(hidden: torch.Tensor) -> torch.Tensor:
            t0 = time.perf_counter()
            probs = self.preverifier.score(hidden)
            timers["preverifier"] += time.perf_counter() - t0
            return probs

        return score

    def draft(self, rid: str, limit: int) -> Draft:
        return self.draft_batch({rid: limit})[rid]

    def draft_batch(self, limits: dict[str, int]) -> dict[str, Draft]:
        """Draft up to ``limits[rid]`` tokens for every request: first the drafter's batched
        ``prepare`` of each request's first block (one forward for all, when the drafter has
        one), then each request's own policy, as for one request alone. Per request, the
        tokens, probs, policy state and random stream are those of drafting it alone; the
        shared pass's time is split evenly among the requests it was run for."""
        reqs = {rid: self.requests[rid] for rid in limits}
        capped = {rid: self._cap(limit) for rid, limit in limits.items()}
        t0 = time.perf_counter()
        prepared = self._prepare({rid: (reqs[rid], limit) for rid, limit in capped.items()})
        shared = (time.perf_counter() - t0) / max(1, len(prepared))
        return {rid: self._draft(req, capped[rid], shared if rid in prepared else 0.0)
                for rid, req in reqs.items()}

    def _cap(self, limit: int) -> int:
        if self.drafter.max_draft_len is not None:
            limit = min(limit, self.drafter.max_draft_len)
        if self.preverifier is not None:  # it cannot score positions it has no embedding for
            limit = min(limit, self.preverifier.c.max_positions)
        return max(0, limit)

    def _prepare(self, batch: dict[str, tuple[DraftRequest, int]]) -> set[str]:
        """Hand the drafter's ``prepare`` (state, n) for every request whose policy will
        propose, n the size of its first ``propose``; returns those requests' ids."""
        prepare = getattr(self.drafter, "prepare", None)
        if prepare is None:
            return set()
        firsts = {rid: req.policy.first(limit, req.policy_state)
                  for rid, (req, limit) in batch.items()}
        ready = {rid: n for rid, n in firsts.items() if n > 0}
        if ready:
            prepare([(batch[rid][0].state, n) for rid, n in ready.items()])
        return set(ready)

    def _draft(self, req: DraftRequest, limit: int, shared_s: float) -> Draft:
        """One request's draft: its policy drives ``propose``, as the paper's loop reads."""
        t0, req.timers["preverifier"] = time.perf_counter(), 0.0

        def propose(n: int) -> DraftBlock:
            return self.drafter.propose(req.state, n, req.sampling)

        blocks = [b for b in req.policy.draft(propose, limit, req.policy_state) if len(b)]
        tokens = [int(t) for b in blocks for t in b.tokens]
        probs = torch.cat([b.probs for b in blocks]) if blocks and not req.sampling.greedy else None
        elapsed, pre = time.perf_counter() - t0, req.timers["preverifier"]
        source = getattr(req.state, "source", None) if tokens else None
        return Draft(tokens, probs, drafter_s=shared_s + elapsed - pre, preverifier_s=pre,
                     source=source)

    def commit(self, rid: str, result: RoundResult, drafted: int) -> None:
        self.commit_batch({rid: (result, drafted)})

    def commit_batch(self, commits: dict[str, tuple[RoundResult, int]]) -> None:
        """End the round of every request: ``commits[rid]`` is what the target committed and
        how many tokens were drafted (the policy's feedback). A drafter with ``commit_batch``
        takes them all at once (the block drafter: one pass over all new context rows)."""
        reqs = {rid: self.requests[rid] for rid in commits}
        items = [(reqs[rid].state, result.tokens, result.features)
                 for rid, (result, _) in commits.items()]
        batch = getattr(self.drafter, "commit_batch", None)
        if batch is not None:
            batch(items)
        else:
            for item in items:
                self.drafter.commit(*item)
        for rid, (result, drafted) in commits.items():
            reqs[rid].policy.update(reqs[rid].policy_state, drafted, result.accepted)

    def close(self, rid: str) -> None:
        req = self.requests.pop(rid, None)
        finish = getattr(self.drafter, "finish", None)  # e.g. the suffix drafter's global tree
        if req is not None and finish is not None:
            finish(req.state)
