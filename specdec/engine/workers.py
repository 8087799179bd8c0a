"""The two sides of a speculative round, each holding its requests' state by request id.

``TargetWorker`` owns the target model, every request's KV cache and verifier state (ASD's
ledger), and runs verification next to the logits. ``DraftWorker`` owns the drafter, the PACER
pre-verifier or the acceptance model (``specdec.models.acceptance``: it keeps each request's
root state from the taps it is handed) and every request's drafter state. Both are
batch-first: a call may carry many requests (dicts keyed by request id) and runs one model
forward for all of them; one request is a batch of one. Only
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
from dataclasses import dataclass, field, replace
from typing import Any

import torch

from specdec.algorithms.policies import POLICIES, DraftPolicy, make_policy
from specdec.algorithms.sampling import Sampling
from specdec.algorithms.verify import Verifier, VerifyInputs, make_verifier
from specdec.engine.logprobs import TokenLogprobs, score
from specdec.engine.settings import GenerationParams
from specdec.models.acceptance import AcceptanceModel, survival
from specdec.models.drafter import DraftBlock, Drafter
from specdec.models.target import TargetModel, TargetOutput, TargetState


@dataclass(frozen=True)
class Draft:
    """What the drafter side sends to the target side for one round."""

    tokens: list[int]  # x_0..x_{K-1}
    probs: torch.Tensor | None  # [K, V] proposal distribution, only when sampling
    drafter_s: float = 0.0
    preverifier_s: float = 0.0
    source: str | None = None  # which draft source the tokens came from (hybrid: suffix | block)
    # [K] the drafter's estimate that the draft up to each token is accepted, where it makes one
    # (``DraftBlock.confidence``); load-aware speculation reads it (``actors.goodput``)
    confidence: tuple[float, ...] | None = None
    # [K] the acceptance model's survival at each token (the chance the draft is accepted up
    # to it), where the model is on; load-aware speculation prices it as it is
    survival: tuple[float, ...] | None = None


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
    verifier_state: Any  # what the verifier keeps across rounds (ASD: the regret ledger)
    generator: torch.Generator
    pending: int  # last verified token, not yet in the cache (see ``primed``)
    # While the prompt is prefilled (possibly in chunks over several steps): the prompt, the
    # tokens of it cached so far and their taps. ``prompt`` is None once the prefill is done.
    prompt: list[int] | None = None
    prefilled: int = 0
    prefill_taps: list[torch.Tensor] = field(default_factory=list)
    # Until the first round: the prefill's outputs at the pending token, which it did cache
    # (logits [1, V], taps [1, F] or None).
    primed: tuple[torch.Tensor, torch.Tensor | None] | None = None
    logprobs: int | None = None  # top alternatives to report per token; None: no logprobs
    # greedy with a lossless verifier: its tokens are the target's whatever it drafts, so a
    # scheduler may shorten its drafts (``draft_free``)
    exact: bool = False


def generators(seed: int) -> tuple[torch.Generator, torch.Generator]:
    """Independent random streams for the drafter and target sides, from one request seed."""
    return torch.Generator().manual_seed(seed), torch.Generator().manual_seed(seed + 1)


@dataclass(frozen=True)
class OpenRequest:
    """One request to prefill: what ``TargetWorker.open`` takes per request id."""

    prompt_ids: list[int]
    params: GenerationParams


@dataclass
class StepResult:
    """What one ``TargetWorker.step`` did, per request id: prefills that finished (the features
    for the drafter), verified rounds, and the requests that failed (their state is freed)."""

    opened: dict[str, torch.Tensor | None] = field(default_factory=dict)
    verified: dict[str, RoundResult] = field(default_factory=dict)
    failed: dict[str, Exception] = field(default_factory=dict)
    forward_s: float = 0.0  # the one shared forward


class TargetWorker:
    """Batch-first: a *step* runs ONE target forward over pieces of work of many requests --
    prefill chunks of newly admitted ones and the drafts of running ones -- then verifies and
    crops each request on its own (one request is a batch of one). ``open`` and ``verify`` are
    the whole-prompt and verify-only steps the single-process engine uses; a serving scheduler
    (``actors.scheduler``) calls ``admit`` and ``step`` directly."""

    def __init__(self, target_model: TargetModel, features: bool):
        self.target_model = target_model
        self.features = features  # whether the drafter needs tapped features
        self.requests: dict[str, TargetRequest] = {}

    @property
    def piece_rows(self) -> int | None:
        """The most rows a batch-invariant runtime runs a linear over at once (None: no runtime,
        or one that is not batch invariant)."""
        runtime = self.target_model.runtime
        return None if runtime is None else runtime.rows

    @property
    def runtime(self):
        """The target's ``specdec.runtime.Forward`` (None on transformers)."""
        return self.target_model.runtime

    def draft_free(self, rid: str) -> bool:
        """Whether the request's committed tokens do not depend on its drafts (greedy, lossless
        verification): shortening a draft then changes only how fast it goes."""
        req = self.requests.get(rid)
        return req is not None and req.exact

    # ---- the engine's calls: whole prompts, or verifies only --------------------------------
    def open(self, batch: dict[str, OpenRequest]) -> dict[str, torch.Tensor | None]:
        """Prefill each whole prompt; return per request the features of all its tokens but the
        last (the pending one) for the drafter, and keep the last token's outputs for the first
        round. All or nothing: if one fails, none stays open."""
        admitted = []
        try:
            for rid, req in batch.items():
                self.admit(rid, req)
                admitted.append(rid)
            out = self.step(prefill={rid: len(batch[rid].prompt_ids) for rid in batch})
        except Exception:
            for rid in admitted:
                self.close(rid)
            raise
        if out.failed:
            for rid in admitted:
                self.close(rid)
            raise next(iter(out.failed.values()))
        return out.opened

    def verify(self, drafts: dict[str, Draft]) -> dict[str, RoundResult]:
        """Score every request's draft in one forward, then verify and crop each."""
        out = self.step(drafts=drafts)
        if out.failed:
            raise next(iter(out.failed.values()))
        return out.verified

    # ---- the scheduler's calls --------------------------------------------------------------
    def admit(self, rid: str, req: OpenRequest) -> None:
        """Take a KV slot (``PoolFull`` when none is free) and the request's verifier; its
        prompt is then prefilled by ``step`` calls, whole or in chunks."""
        if rid in self.requests:
            raise ValueError(f"request {rid!r} is already open")
        state = self.target_model.new_state()
        try:
            spec = req.params.spec
            name, config, extra = spec.verifier(req.params.temperature,
                                                **req.params.warp_params())
            verifier = make_verifier(name, config, **extra)
        except Exception:
            self.target_model.release(state)
            raise
        _, target_gen = generators(req.params.seed)
        self.requests[rid] = TargetRequest(state, verifier, verifier.new_state(), target_gen,
                                           pending=req.prompt_ids[-1],
                                           prompt=list(req.prompt_ids),
                                           logprobs=req.params.logprobs,
                                           exact=req.params.temperature == 0 and verifier.lossless)

    def step(self, prefill: dict[str, int] | None = None,
             drafts: dict[str, Draft] | None = None) -> StepResult:
        """One forward: the next ``prefill[rid]`` prompt tokens of each prefilling request and
        [pending, *draft] of each verifying one. A request that fails (a draft past the context,
        a verifier error) is closed and reported in ``failed``; the others go on."""
        prefill, drafts = prefill or {}, drafts or {}
        out = StepResult()
        feeds = {}  # rid -> (ids, last logits only)
        for rid, n in prefill.items():
            req = self.requests[rid]
            lo = req.prefilled
            feeds[rid] = (req.prompt[lo:lo + n], True)
        for rid, draft in drafts.items():
            req = self.requests[rid]
            if req.prompt is not None:
                raise ValueError(f"request {rid!r} is still prefilling")
            if req.primed is not None and not draft.tokens:
                continue  # a first round with an empty draft: the prefill already scored it
            ids = draft.tokens if req.primed is not None else [req.pending, *draft.tokens]
            feeds[rid] = (ids, False)
        for rid in list(feeds):  # a request that cannot extend fails alone, before the forward
            try:
                self.target_model.check(self.requests[rid].state, feeds[rid][0])
            except ValueError as e:
                del feeds[rid]
                self._fail(out, rid, e)
        t0 = time.perf_counter()
        outs = self.target_model.forward_batch(
            [self.requests[rid].state for rid in feeds], [ids for ids, _ in feeds.values()],
            taps=self.features, last_logits_only=[last for _, last in feeds.values()],
        ) if feeds else []
        out.forward_s = time.perf_counter() - t0
        scored = dict(zip(feeds, outs, strict=True))
        for rid in prefill:
            if rid in scored:
                self._prefilled(out, rid, len(feeds[rid][0]), scored[rid])
        for rid, draft in drafts.items():
            if rid in out.failed:
                continue
            t1 = time.perf_counter()
            req = self.requests[rid]
            try:
                result = self._settle(req, draft, *self._scored(req, scored.get(rid)))
            except Exception as e:  # noqa: BLE001 -- one request's error ends that request only
                self._fail(out, rid, e)
                continue
            out.verified[rid] = replace(result, target_s=out.forward_s + time.perf_counter() - t1)
        return out

    def _fail(self, out: StepResult, rid: str, error: Exception) -> None:
        out.failed[rid] = error
        self.close(rid)

    def _prefilled(self, out: StepResult, rid: str, fed: int, scored: TargetOutput) -> None:
        """Account for a prefill chunk; once the whole prompt is cached, the request is open:
        the drafter gets the taps of all prompt tokens but the last, and the last token's
        outputs wait (``primed``) for the first round."""
        req = self.requests[rid]
        req.prefilled += fed
        if scored.taps is not None:
            req.prefill_taps.append(scored.taps)
        if req.prefilled < len(req.prompt):
            return
        taps = torch.cat(req.prefill_taps) if req.prefill_taps else None
        req.primed = (scored.logits[-1:], None if taps is None else taps[-1:])  # on its device
        req.prompt, req.prefill_taps = None, []
        out.opened[rid] = None if taps is None else taps[:-1].cpu()

    @staticmethod
    def _scored(req: TargetRequest, out: TargetOutput | None):
        """Target logits [K+1, V] and taps [K+1, F] (or None) at [pending, *draft], and the
        forwards that took (0: a first round with an empty draft, which the prefill scored)."""
        if req.primed is None:
            return out.logits, out.taps, 1
        (logits, taps), req.primed = req.primed, None
        if out is None:
            return logits, taps, 0
        both = None if taps is None else torch.cat([taps, out.taps])
        return torch.cat([logits, out.logits]), both, 1

    def _settle(self, req: TargetRequest, draft: Draft, logits, taps, passes) -> RoundResult:
        start = req.state.length - len(draft.tokens) - 1  # where the pending token sits
        # K+1 rows of logits are small next to a forward pass: verify on the CPU, where the
        # request's generator lives, whatever device the target runs on.
        inputs = VerifyInputs(logits.cpu(), torch.tensor(draft.tokens, dtype=torch.long),
                              draft.probs, req.generator)
        verdict = req.verifier.verify(req.verifier_state, inputs)
        self.target_model.crop(req.state, start + 1 + verdict.accepted)
        req.pending = verdict.tokens[-1]
        features = None if taps is None else taps[: verdict.accepted + 1].cpu()
        logprobs = None if req.logprobs is None else score(logits.cpu(), verdict.tokens, req.logprobs)
        return RoundResult(verdict.tokens, verdict.accepted, verdict.regret, verdict.exceptions,
                           features, 0.0, passes, logprobs)

    def room(self, rid: str) -> int:
        """Draft tokens the context still has room for in the next round."""
        req = self.requests[rid]
        verified = req.state.length + (req.primed is None)  # the pending token included
        return self.target_model.max_length - verified

    def close(self, rid: str) -> None:
        req = self.requests.pop(rid, None)
        if req is not None:
            self.target_model.release(req.state)


@dataclass(frozen=True)
class Ahead:
    """A request's whole window drafted before its policy runs (``DraftWorker._ahead``)."""

    window: DraftBlock  # its hidden: the acceptance model's inputs
    scores: torch.Tensor | None  # [n] the acceptance model's, of the whole window
    drafter_s: float  # its share of the drafter's time and of the model's
    model_s: float


@dataclass
class DraftRequest:
    state: Any
    policy: DraftPolicy
    policy_state: Any
    sampling: Sampling
    # {"preverifier": seconds in this round's pre-verifier calls, "scores": its last scores,
    # "ready": the scores of the window drafted ahead}
    timers: dict
    # [W] the acceptance model's term of the draft's root state (``AcceptanceModel.root``),
    # while it scores the request's drafts
    root: torch.Tensor | None = None
    scored: bool = False  # its policy reads scores (PACER's scorer)


class DraftWorker:
    """``draft_batch`` and ``commit_batch`` take dicts keyed by request id; drafters with the
    optional ``prepare`` / ``commit_batch`` (block, hybrid) batch their forwards across the
    requests, the others (n-gram, suffix, AR) run per request. ``open`` takes dicts too;
    ``draft`` / ``commit`` are the batch of one."""

    def __init__(self, draft_model: Drafter, preverifier: torch.nn.Module | None = None,
                 acceptance: AcceptanceModel | None = None):
        if preverifier is not None and acceptance is not None:
            raise ValueError("PACER reads a pre-verifier or an acceptance model, not both")
        self.draft_model = draft_model
        self.preverifier = preverifier
        self.acceptance = acceptance
        # whether a caller reads a draft's survival (a scheduler that prices drafts: it sets
        # this); else a draft carries it only where PACER's scores give it for free
        self.survival = False
        self.requests: dict[str, DraftRequest] = {}

    @property
    def batches(self) -> bool:
        """Whether a batch of requests costs less than each alone: the drafter runs forwards
        batched across requests (``prepare`` / ``commit_batch``), or the acceptance model's
        calls are (``_ahead``)."""
        return any(hasattr(self.draft_model, m) for m in ("prepare", "commit_batch")) or \
            self._scores_ahead

    def open(self, batch: dict[str, OpenRequest],
             features: dict[str, torch.Tensor | None]) -> None:
        """Start every request of ``batch`` on its prompt and the target's ``features`` of it
        (what ``TargetWorker.open`` returned, keyed alike). All or nothing."""
        opened = []
        try:
            for rid, req in batch.items():
                self._open(rid, req.prompt_ids, features.get(rid), req.params)
                opened.append(rid)
        except Exception:
            for rid in opened:
                self.close(rid)
            raise

    def _open(self, rid: str, prompt_ids: list[int], features, params: GenerationParams) -> None:
        if rid in self.requests:
            raise ValueError(f"request {rid!r} is already open")
        spec = params.spec
        if getattr(self.draft_model, "pacer_inside", False) and spec.policy != "fixed":
            raise ValueError(f"policy {spec.policy} with the hybrid drafter: it runs PACER on "
                             "its block draft itself; use policy fixed (gamma caps the draft)")
        extra = {}
        timers = {"preverifier": 0.0, "scores": None, "ready": None}
        root = None
        if self.acceptance is not None and spec.acceptance:
            root = self.acceptance.root(features)
        if "scorer" in POLICIES.get(spec.policy).needs:
            extra["scorer"] = self._timed_scorer(timers, root is not None)
        policy = make_policy(spec.policy, spec.policy_config, **extra)
        draft_gen, _ = generators(params.seed)
        # drafters that read per-request settings (suffix, hybrid) get them at start
        settings = {"settings": spec} if getattr(self.draft_model, "reads_settings", False) else {}
        self.requests[rid] = DraftRequest(
            self.draft_model.start(prompt_ids, features, **settings), policy, policy.new_state(),
            Sampling(params.temperature, draft_gen, **params.warp_params()), timers, root,
            scored="scorer" in extra,
        )

    def _timed_scorer(self, timers: dict, acceptance: bool):
        """PACER's scorer: the acceptance model over the blocks' inputs (``_draft`` puts them in
        each block's hidden) when the request has it on, else the pre-verifier over the
        drafter's hidden states."""
        net = self.acceptance if acceptance else self.preverifier
        if net is None:
            return None  # make_policy then says that PACER needs a pre-verifier

        def score(hidden: torch.Tensor) -> torch.Tensor:
            ready = timers.get("ready")  # the round's window scored ahead (``_ahead``)
            if ready is not None and hidden.shape[0] <= ready.shape[0]:
                probs = ready[:hidden.shape[0]]  # causal: a prefix's scores are its own
            else:
                t0 = time.perf_counter()
                probs = net.score(hidden)
                timers["preverifier"] += time.perf_counter() - t0
            timers["scores"] = probs
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
        ahead = self._ahead({rid: (reqs[rid], limit) for rid, limit in capped.items()})
        return {rid: self._draft(req, capped[rid], shared if rid in prepared else 0.0,
                                 ahead.get(rid))
                for rid, req in reqs.items()}

    def _cap(self, limit: int) -> int:
        if self.draft_model.max_draft_len is not None:
            limit = min(limit, self.draft_model.max_draft_len)
        if self.preverifier is not None:  # it cannot score positions it has no embedding for
            limit = min(limit, self.preverifier.c.max_positions)
        if self.acceptance is not None:
            limit = min(limit, self.acceptance.max_positions)
        return max(0, limit)

    def _prepare(self, batch: dict[str, tuple[DraftRequest, int]]) -> set[str]:
        """Hand the drafter's ``prepare`` (state, n) for every request whose policy will
        propose, n the size of its first ``propose``; returns those requests' ids."""
        prepare = getattr(self.draft_model, "prepare", None)
        if prepare is None:
            return set()
        firsts = {rid: req.policy.first(limit, req.policy_state)
                  for rid, (req, limit) in batch.items()}
        ready = {rid: n for rid, n in firsts.items() if n > 0}
        if ready:
            prepare([(batch[rid][0].state, n) for rid, n in ready.items()])
        return set(ready)

    @property
    def _scores_ahead(self) -> bool:
        return self.acceptance is not None and getattr(self.draft_model, "drafts_whole", False)

    def _ahead(self, batch: dict[str, tuple[DraftRequest, int]]) -> dict[str, Ahead]:
        """For a drafter that drafts whole windows (``drafts_whole``) under the acceptance
        model: the window of every greedy request whose scores are read (by its policy or by
        the caller), proposed at once, and the model's scores of all of them from one batched
        call (its cost is mostly per call, so one call a step rather than one per block of every
        request). Each request's policy then reads its window (``_draft``). A batched score
        rounds otherwise than a score alone, so a draft may end a token sooner or later than
        alone: greedy requests only, whose output no draft moves. The time is split evenly
        among the requests."""
        if not self._scores_ahead:
            return {}
        on = {rid: (req, limit) for rid, (req, limit) in batch.items()
              if req.root is not None and req.sampling.greedy and limit > 0
              and (req.scored or self.survival)}
        if not on:
            return {}
        t0 = time.perf_counter()
        windows = {rid: self.draft_model.propose(req.state, limit, req.sampling)
                   for rid, (req, limit) in on.items()}
        t1 = time.perf_counter()
        full = [rid for rid, w in windows.items() if len(w)]
        scores = {}
        if full:
            inputs = self.acceptance.inputs_many([(on[rid][0].root, windows[rid].tokens,
                                                   windows[rid].hidden) for rid in full])
            scores = dict(zip(full, self.acceptance.score_many(inputs), strict=True))
            windows |= {rid: replace(windows[rid], hidden=x)
                        for rid, x in zip(full, inputs, strict=True)}
        drafter_s, model_s = (t1 - t0) / len(on), (time.perf_counter() - t1) / len(on)
        return {rid: Ahead(w, scores.get(rid), drafter_s, model_s) for rid, w in windows.items()}

    def _draft(self, req: DraftRequest, limit: int, shared_s: float,
               ahead: Ahead | None = None) -> Draft:
        """One request's draft: its policy drives ``propose``, as the paper's loop reads; with
        ``ahead``, ``propose`` hands out the window drafted and scored ahead."""
        t0 = time.perf_counter()
        req.timers.update(preverifier=ahead.model_s if ahead else 0.0, scores=None,
                          ready=ahead.scores if ahead else None)
        handed = 0

        def propose(n: int) -> DraftBlock:
            nonlocal handed
            if ahead is not None:
                block = ahead.window.part(handed, handed + max(n, 0))
                handed += len(block)
                return block
            block = self.draft_model.propose(req.state, n, req.sampling)
            if req.root is None:
                return block
            return replace(block, hidden=self.acceptance.inputs(req.root, block.tokens,
                                                                block.hidden))

        blocks = [b for b in req.policy.draft(propose, limit, req.policy_state) if len(b)]
        tokens = [int(t) for b in blocks for t in b.tokens]
        probs = torch.cat([b.probs for b in blocks]) if blocks and not req.sampling.greedy else None
        surviving = self._survival(req, blocks, len(tokens))
        pre = req.timers["preverifier"]
        # the time in this call's own model calls (``ahead``'s share was spent before it)
        elapsed = time.perf_counter() - t0 - (pre - (ahead.model_s if ahead else 0.0))
        source = getattr(req.state, "source", None) if tokens else None
        confidence = None
        if blocks and all(b.confidence is not None for b in blocks):
            confidence = tuple(float(c) for b in blocks for c in b.confidence)
        return Draft(tokens, probs, drafter_s=shared_s + (ahead.drafter_s if ahead else 0.0)
                     + elapsed, preverifier_s=pre, source=source, confidence=confidence,
                     survival=surviving)

    def _survival(self, req: DraftRequest, blocks: list[DraftBlock],
                  n: int) -> tuple[float, ...] | None:
        """The draft's survival by the acceptance model (None: off for the request); PACER's
        last scores when they cover the draft, else one scoring of it (timed as PACER's) when
        a caller reads it (``survival``)."""
        if req.root is None or n == 0:
            return None
        scores = req.timers["scores"]  # PACER's last, else the window's scored ahead
        scores = req.timers["ready"] if scores is None else scores
        if scores is not None and scores.shape[0] >= n:
            scores = scores[:n]  # causal: a prefix's scores are its own
        else:
            if not self.survival:
                return None
            t0 = time.perf_counter()
            scores = self.acceptance.score(torch.cat([b.hidden for b in blocks]))
            req.timers["preverifier"] += time.perf_counter() - t0
        return survival(scores)

    def commit(self, rid: str, result: RoundResult, drafted: int) -> None:
        self.commit_batch({rid: (result, drafted)})

    def commit_batch(self, commits: dict[str, tuple[RoundResult, int]]) -> None:
        """End the round of every request: ``commits[rid]`` is what the target committed and
        how many tokens were drafted (the policy's feedback). A drafter with ``commit_batch``
        takes them all at once (the block drafter: one pass over all new context rows)."""
        reqs = {rid: self.requests[rid] for rid in commits}
        items = [(reqs[rid].state, result.tokens, result.features)
                 for rid, (result, _) in commits.items()]
        batch = getattr(self.draft_model, "commit_batch", None)
        if batch is not None:
            batch(items)
        else:
            for item in items:
                self.draft_model.commit(*item)
        for rid, (result, drafted) in commits.items():
            reqs[rid].policy.update(reqs[rid].policy_state, drafted, result.accepted)
        # the new roots, each last verified position's state: the greedy requests' in one call
        # (batched, a root rounds otherwise than alone: only a greedy request's output is sure
        # not to follow its drafts), each other request's alone
        rooted = [rid for rid in commits if reqs[rid].root is not None]
        greedy = [rid for rid in rooted if reqs[rid].sampling.greedy]
        if greedy:
            roots = self.acceptance.roots([commits[rid][0].features for rid in greedy])
            for rid, root in zip(greedy, roots, strict=True):
                reqs[rid].root = root
        for rid in rooted:
            if rid not in greedy:
                reqs[rid].root = self.acceptance.root(commits[rid][0].features)

    def close(self, rid: str) -> None:
        req = self.requests.pop(rid, None)
        finish = getattr(self.draft_model, "finish", None)  # e.g. the suffix drafter's global tree
        if req is not None and finish is not None:
            finish(req.state)
