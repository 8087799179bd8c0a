"""The HTTP ingress and orchestrator replica: OpenAI-compatible routes over the round loop.

A plain class whose ``asgi_app()`` builds a FastAPI app bound to it; ``cluster.app.build_app``
turns it into a Serve deployment and passes it the function that starts the two actors.
``cluster.guard`` checks the API key and the body size first. It validates every request before any
model runs (bad input is a 400, an unknown model a 404, a full server a 503, never a 500),
tokenises with the target's tokenizer, and streams rounds as SSE chunks.

A request of ``n`` choices is a ``Job`` of n requests on the target actor (seeds seed + i), each
holding one concurrency slot. Stop strings are checked here, on what the target commits
(``cluster.orchestrator.Served`` with ``specdec.engine.stops.StopStrings`` over this tokenizer),
so a round that runs past one is cut exactly as at EOS; ``TextStream`` holds back text that may
begin one.
``GET /metrics`` renders ``cluster.prometheus.ApiMetrics``.
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
import math
import os
import secrets
import time
from collections.abc import AsyncIterator
from contextlib import aclosing
from dataclasses import replace
from functools import partial

import anyio
import ray
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.background import BackgroundTask
from transformers import AutoTokenizer

from cluster import protocol as wire
from cluster.detokenize import TextStream
from cluster.guard import OPEN_PATHS, Guard, api_key
from cluster.orchestrator import Orchestrator, Served, control
from cluster.prometheus import CONTENT_TYPE, ApiMetrics, Fanout
from cluster.schema import ServeArgs
from specdec.algorithms.policies import POLICIES
from specdec.algorithms.sampling import Warp
from specdec.engine.engine import check_pair, check_prompt
from specdec.engine.settings import GenerationParams, SpecSettings
from specdec.engine.stops import StopStrings
from specdec.models.registry import resolve_model_ref
from specdec.models.sources import resolve
from specdec.runtime import PoolFull

log = logging.getLogger("specdec.server")


def is_unicode(text: str) -> bool:
    """False for text that UTF-8 cannot encode (JSON allows lone surrogates like ``\\ud800``)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True



def failure(e: Exception) -> wire.ApiError:
    """A request that failed in an actor: a full KV pool is a 503 (retry later), the rest 500."""
    if isinstance(e, PoolFull):  # Ray's task error is an instance of the actor's exception
        return wire.ApiError(503, str(e), "server_overloaded", code="kv_cache_full")
    return wire.ApiError(500, str(e), "server_error")


class ClosingStream(StreamingResponse):
    """A streaming response that closes its body generator however sending ends. When a client
    leaves, the send is cancelled between chunks and Starlette drops the generator unclosed: its
    ``finally`` (freeing the slot and the actors' state) would wait for garbage collection."""

    async def stream_response(self, send) -> None:
        try:
            await super().stream_response(send)
        finally:
            with anyio.CancelScope(shield=True):
                await self.body_iterator.aclose()


# The replica's process id, on ``GET /debug/active`` and on every streamed response: tells
# replicas apart (tests, operators), e.g. which requests a lost replica was serving.
REPLICA_HEADER = "x-specdec-replica"


class Server:
    def __init__(self, args: dict, spawn, observer=None):
        self.args = ServeArgs.model_validate(args)
        # the served defaults; a request's speculative field is laid over them
        self.served_spec = SpecSettings(**self.args.speculative.model_dump(exclude_unset=True))
        self.target_actor, self.drafter_actor = spawn(self.args)
        self.info = ray.get(self.target_actor.info.remote())
        if self.drafter_actor is not None:
            check_pair(self.info, ray.get(self.drafter_actor.info.remote()))
        self.tokenizer = AutoTokenizer.from_pretrained(resolve(resolve_model_ref(self.args.target)))
        self.model_id = self.args.served_model_id
        self.observer = observer  # the Ray metrics (``GET /debug/metrics`` has their totals)
        self.prometheus = ApiMetrics(self.model_id, self.args.limits.kv_slots)  # ``GET /metrics``
        self.orchestrator = Orchestrator(self.target_actor, self.drafter_actor,
                                         Fanout(observer, self.prometheus))
        self.slots: set[str] = set()  # request ids holding a concurrency slot
        self.reaper: asyncio.Task | None = None  # started with the first request

    # ---- routes -----------------------------------------------------------------------------
    def asgi_app(self) -> FastAPI:
        """The HTTP app, its routes bound to this instance, behind the key and body-size gate."""
        app = FastAPI(title="specdec")
        app.add_api_route("/health", self.health, methods=["GET"])
        app.add_api_route("/v1/models", self.models, methods=["GET"])
        app.add_api_route("/v1/completions", self.completions, methods=["POST"],
                          openapi_extra=wire.openapi_body(wire.CompletionRequest))
        app.add_api_route("/v1/chat/completions", self.chat_completions, methods=["POST"],
                          openapi_extra=wire.openapi_body(wire.ChatRequest))
        app.add_api_route("/debug/active", self.active, methods=["GET"])
        app.add_api_route("/debug/actors", self.actors, methods=["GET"])
        app.add_api_route("/debug/metrics", self.metrics, methods=["GET"])
        app.add_api_route("/metrics", self.prometheus_text, methods=["GET"])
        open_paths = OPEN_PATHS | ({"/metrics"} if self.args.metrics_public else set())
        app.add_middleware(Guard, key=api_key(self.args.api_key),
                           max_body_bytes=self.args.limits.max_body_bytes, open_paths=open_paths)
        return app

    async def health(self) -> dict:
        return {"status": "ok", "model": self.model_id, "in_flight": len(self.slots),
                "plan": self.info.plan}

    async def models(self) -> dict:
        return {"object": "list", "data": [{"id": self.model_id, "object": "model",
                                            "owned_by": "specdec",
                                            "max_model_len": self.info.max_length}]}

    async def completions(self, request: Request):
        return await self._serve(request, chat=False)

    async def chat_completions(self, request: Request):
        return await self._serve(request, chat=True)

    async def active(self) -> JSONResponse:
        """Request ids holding state in each actor of this replica, for tests and operators;
        the ``x-specdec-replica`` header (the replica's process id) tells replicas apart."""
        drafter_actor = self.drafter_actor
        drafter = [] if drafter_actor is None else await control(drafter_actor.active).remote()
        return JSONResponse({"target": await control(self.target_actor.active).remote(),
                             "drafter": drafter}, headers={REPLICA_HEADER: str(os.getpid())})

    async def actors(self) -> dict:
        """Process id and resident memory of each actor (for tests and operators)."""
        drafter_actor = self.drafter_actor
        drafter = None if drafter_actor is None else await control(drafter_actor.process).remote()
        return {"target": await control(self.target_actor.process).remote(), "drafter": drafter}

    async def metrics(self) -> dict:
        """Running totals of the metrics this replica exported (Prometheus has the rest)."""
        return self.observer.snapshot() if self.observer is not None else {}

    async def prometheus_text(self) -> Response:
        """Prometheus text exposition of this replica's request, token and SD counters."""
        return Response(self.prometheus.exposition(len(self.slots)), media_type=CONTENT_TYPE)

    # ---- one request ------------------------------------------------------------------------
    async def _serve(self, request: Request, chat: bool):
        self._start_reaper()
        t0 = time.perf_counter()
        try:
            req, prompt_ids, params = await self._validate(request, chat)
            job = Job(wire.new_id("chatcmpl" if chat else "cmpl"), chat, req, t0)
            self._acquire(job.rids)
        except wire.ApiError as e:
            return JSONResponse(e.body(), status_code=e.status)
        stops = None if not job.stops else StopStrings(job.stops, self._decode)
        job.runs = [Served(prompt_ids, replace(params, seed=params.seed + i), stops)
                    for i in range(req.n)]
        if req.stream:
            # The slots are freed by the stream's end, or by the background task when a client
            # leaves before the first byte (the stream body then never starts).
            return ClosingStream(self._stream(job), media_type="text/event-stream",
                                 headers={REPLICA_HEADER: str(os.getpid())},
                                 background=BackgroundTask(self._finish, job))
        try:
            async with aclosing(self._rounds(job)) as rounds:
                async for _ in rounds:
                    pass
        except Exception as e:  # a failed or restarting actor: an error body, not a bare 500
            log.exception("request %s failed", job.rid)
            error = failure(e)
            return JSONResponse(error.body(), status_code=error.status)
        finally:
            self._finish(job)
        choices = [self._whole_choice(job, i) for i in range(req.n)]
        return JSONResponse(wire.response(job.rid, chat, self.model_id, choices,
                                          self._totals(job, top_stats=True)))

    def _whole_choice(self, job: Job, i: int) -> dict:
        run = job.runs[i]
        text = self._decode(run.token_ids)
        if run.stops is not None:
            text = run.stops.visible(text)
        logprobs = self._logprobs(job, run.token_ids, run.all_logprobs(), 0)
        return wire.choice(job.chat, i, text, run.token_ids, run.finish_reason,
                           logprobs=logprobs, stats=run.stats.to_dict())

    async def _stream(self, job: Job) -> AsyncIterator[str]:
        texts = [TextStream(self.tokenizer, run.stops) for run in job.runs]
        offsets = [0] * len(job.runs)  # text_offset of each choice's next token
        usage = {"usage": None} if job.include_usage else {}
        try:
            async with aclosing(self._rounds(job)) as rounds:
                async for i, new, lp in rounds:
                    run = job.runs[i]
                    if new is None:  # choice i is done
                        choice = wire.choice(job.chat, i, texts[i].finish(), [], run.finish_reason,
                                             delta=True, stats=run.stats.to_dict())
                        extra = {**usage, **self._top_stats(job)}
                    else:
                        logprobs = self._logprobs(job, new, lp, offsets[i])
                        if logprobs is not None and not job.chat:
                            offsets[i] += sum(len(t) for t in logprobs["tokens"])
                        choice = wire.choice(job.chat, i, texts[i].add(new), new, None,
                                             delta=True, logprobs=logprobs)
                        extra = usage
                    yield wire.sse(wire.response(job.rid, job.chat, self.model_id, [choice],
                                                 extra, chunk=True))
            if job.include_usage:  # OpenAI's usage chunk: empty choices, then [DONE]
                yield wire.sse(wire.response(job.rid, job.chat, self.model_id, [],
                                             self._totals(job), chunk=True))
        except Exception as e:  # headers are sent: report in-band, as OpenAI does
            log.exception("request %s failed mid-stream", job.rid)
            yield wire.sse(failure(e).body())
        finally:
            self._finish(job)
        yield wire.sse("[DONE]")

    def _rounds(self, job: Job) -> AsyncIterator[tuple[int, list[int] | None, object]]:
        """(choice index, newly committed tokens, their TokenLogprobs or None) as rounds end,
        then (index, None, None) when that choice is done. n > 1 choices run concurrently, each
        its own request on the actors."""
        gens = [self._choice_rounds(job, i) for i in range(len(job.runs))]
        return gens[0] if len(gens) == 1 else merged(gens)

    async def _choice_rounds(self, job: Job, i: int):
        run = job.runs[i]
        # Tokens read as they come: a streamed response, or stop strings (checked here); else
        # the target sends a request's answer at its end.
        incremental = job.req.stream or run.stops is not None
        async with aclosing(self.orchestrator.run(job.rids[i], run, incremental,
                                                  partial(job.first_token, self.prometheus))
                            ) as rounds:
            async for new in rounds:
                # read now: with n > 1 the next round may settle before this item is consumed
                yield i, new, (run.logprobs[-1] if run.params.logprobs is not None else None)
        yield i, None, None

    def _logprobs(self, job: Job, tokens: list[int], lp, offset: int) -> dict | None:
        """The wire ``logprobs`` of ``tokens`` (lp: their TokenLogprobs, or None)."""
        if lp is None:
            return None
        pieces = self._pieces(tokens)
        top = [list(zip(self._pieces(ids), lps, strict=True))
               for ids, lps in zip(lp.top_ids, lp.top_logprobs, strict=True)]
        if job.chat:
            return wire.chat_logprobs(pieces, lp.logprobs, top)
        return wire.completion_logprobs(pieces, lp.logprobs, top, offset)

    def _pieces(self, ids: list[int]) -> list[str]:
        """Each token's own text."""
        return [self.tokenizer.decode([t]) for t in ids]

    def _decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=True)

    def _start_reaper(self) -> None:
        """Free orphaned request state every ``limits.reap_every_s`` seconds, on this loop, in
        a context of its own: started from a request, it must not share its fate (see
        ``cluster.orchestrator.detached``)."""
        every = self.args.limits.reap_every_s
        if self.reaper is None and every > 0:
            self.reaper = asyncio.get_running_loop().create_task(
                self._reap_forever(every), context=contextvars.Context())

    async def _reap_forever(self, every: float) -> None:
        while True:
            await asyncio.sleep(every)
            try:
                if orphans := await self.orchestrator.reap():
                    log.warning("freed state of %d orphaned requests: %s", len(orphans), orphans)
            except Exception:  # an actor restarting: try again next period
                log.exception("reaping orphaned request state failed")

    def _totals(self, job: Job, top_stats: bool = False) -> dict:
        generated = sum(len(run.token_ids) for run in job.runs)
        return {"usage": wire.usage(len(job.runs[0].prompt_ids), generated),
                **(self._top_stats(job) if top_stats else {})}

    @staticmethod
    def _top_stats(job: Job) -> dict:
        """The top-level ``spec_decode`` of a one-choice response (each choice has its own)."""
        return {"spec_decode": job.runs[0].stats.to_dict()} if len(job.runs) == 1 else {}

    def _acquire(self, rids: list[str]) -> None:
        limit = self.args.limits.max_concurrent_requests
        if len(self.slots) + len(rids) > limit:
            raise wire.ApiError(503, f"the server is at its limit of {limit} concurrent "
                                "requests (each of n choices takes one); retry later",
                                "server_overloaded", code="too_many_requests")
        self.slots.update(rids)

    def _finish(self, job: Job) -> None:
        """Free the request's slots and record it, once (the stream and its background task
        both call this)."""
        if job.finished:
            return
        job.finished = True
        self.slots.difference_update(job.rids)
        runs = job.runs or []
        reasons = [run.finish_reason for run in runs]
        self.prometheus.request(len(runs[0].prompt_ids) if runs else 0,
                                sum(len(run.token_ids) for run in runs),
                                reasons[0] if reasons and all(reasons) else None,
                                time.perf_counter() - job.t0)

    # ---- validation -------------------------------------------------------------------------
    async def _validate(self, request: Request, chat: bool):
        try:
            body = await request.json()
        except ValueError:
            raise wire.ApiError(400, "the body is not valid JSON", code="invalid_json") from None
        req = wire.parse(wire.ChatRequest if chat else wire.CompletionRequest, body)
        if req.model != self.model_id:
            raise wire.ApiError(404, f"the model {req.model!r} does not exist; this server "
                                f"serves {self.model_id!r}", param="model", code="model_not_found")
        wire.refuse_unsupported(req)
        check_choices(req, self.args.limits.max_concurrent_requests)
        prompt_ids = self._encode(req, chat)
        return req, prompt_ids, self._params(req, chat, len(prompt_ids))

    def _encode(self, req, chat: bool) -> list[int]:
        param = "messages" if chat else "prompt"
        texts = [m.text for m in req.messages] if chat else [req.prompt]
        if not all(is_unicode(t) for t in texts if isinstance(t, str)):
            raise wire.ApiError(400, f"the {param} is not valid Unicode (a lone surrogate?)",
                                param=param, code="invalid_prompt")
        if chat:
            if not any(t.strip() for t in texts):
                raise wire.ApiError(400, "the messages are empty", param=param, code="empty_prompt")
            messages = [{"role": m.role, "content": m.text} for m in req.messages]
            ids = self.tokenizer.apply_chat_template(messages, add_generation_prompt=True,
                                                     tokenize=True)
            ids = list(ids["input_ids"] if hasattr(ids, "keys") else ids)
        elif isinstance(req.prompt, str):
            if not req.prompt.strip():
                raise wire.ApiError(400, "the prompt is empty", param=param, code="empty_prompt")
            ids = self.tokenizer(req.prompt)["input_ids"]
        else:
            ids = list(req.prompt)
        try:
            check_prompt(ids, self.info)
        except ValueError as e:
            raise wire.ApiError(400, str(e), param=param, code="invalid_prompt") from None
        return ids

    def _params(self, req, chat: bool, prompt_len: int) -> GenerationParams:
        max_tokens = self._max_tokens(req, prompt_len)
        if not (req.temperature >= 0 and math.isfinite(req.temperature)):
            raise wire.ApiError(400, f"temperature must be finite and >= 0, got {req.temperature}",
                                param="temperature", code="invalid_value")
        asked = {} if req.speculative is None else req.speculative.model_dump(exclude_unset=True)
        try:  # the request's settings over the server's (both checked knob by knob already)
            spec = self.served_spec.updated(**asked)
        except ValueError as e:
            raise wire.ApiError(400, str(e), param="speculative", code="invalid_value") from None
        if spec.policy != "fixed" and self.args.drafter == "hybrid":
            raise wire.ApiError(400, "the hybrid drafter runs PACER itself; use policy fixed",
                                param="speculative.policy", code="invalid_value")
        scored = self.args.preverifier is not None or (self.args.acceptance and spec.acceptance)
        if "scorer" in POLICIES.get(spec.policy).needs and not scored:
            raise wire.ApiError(400, f"policy {spec.policy} needs a pre-verifier or an acceptance "
                                "model turned on (speculative.acceptance); this request has "
                                "neither", param="speculative.policy", code="invalid_value")
        stop_ids = frozenset(req.stop_token_ids or ())
        if any(not 0 <= t < self.info.vocab_size for t in stop_ids):
            raise wire.ApiError(400, f"stop_token_ids must lie in [0, {self.info.vocab_size})",
                                param="stop_token_ids", code="invalid_value")
        seed = new_seed() if req.seed is None else req.seed
        if not 0 <= seed <= MAX_SEED:
            raise wire.ApiError(400, f"seed must be in [0, {MAX_SEED}], got {seed}",
                                param="seed", code="invalid_value")
        warp = dict(top_k=req.top_k, top_p=req.top_p, min_p=req.min_p)
        for name, value in warp.items():  # name the field before the dataclass says why
            try:
                Warp(1.0, **{name: value})
            except ValueError as e:
                raise wire.ApiError(400, str(e), param=name, code="invalid_value") from None
        try:
            return GenerationParams(max_tokens, req.temperature, seed, spec,
                                    stop_token_ids=stop_ids, logprobs=logprobs_of(req, chat),
                                    **warp)
        except ValueError as e:
            raise wire.ApiError(400, str(e), param="speculative", code="invalid_value") from None

    def _max_tokens(self, req, prompt_len: int) -> int:
        """The request's, else the context left after the prompt (capped by the limits)."""
        limits = self.args.limits
        max_tokens = req.max_tokens
        if max_tokens is None:
            max_tokens = getattr(req, "max_completion_tokens", None)
        if max_tokens is None:
            left = self.info.max_length - prompt_len
            return min(left, limits.max_tokens, limits.default_max_tokens or left)
        if not 1 <= max_tokens <= limits.max_tokens:
            raise wire.ApiError(400, f"max_tokens must be in [1, {limits.max_tokens}], got "
                                f"{max_tokens}", param="max_tokens", code="invalid_value")
        return max_tokens


MAX_SEED = 2**62  # seed + i (n choices) and seed + 1 (the target's stream) stay below 2**63


def new_seed() -> int:
    """A request without a seed samples with a fresh one, as OpenAI's does."""
    return secrets.randbelow(2**31)


def check_choices(req, limit: int) -> None:
    """n, stop, stream_options and the logprobs fields, before any model runs."""
    def bad(param: str, message: str):
        raise wire.ApiError(400, message, param=param, code="invalid_value")

    if not 1 <= req.n <= limit:
        bad("n", f"n must be in [1, {limit}] (the server's concurrent request limit), got {req.n}")
    stops = [req.stop] if isinstance(req.stop, str) else (req.stop or [])
    if len(stops) > wire.MAX_STOPS or not all(stops):
        bad("stop", f"stop must be a non-empty string or a list of at most {wire.MAX_STOPS}")
    if req.stream_options is not None and not req.stream:
        bad("stream_options", "stream_options needs stream=true")
    if isinstance(req, wire.ChatRequest):
        if req.top_logprobs is not None and not req.logprobs:
            bad("top_logprobs", "top_logprobs needs logprobs=true")
        if not 0 <= (req.top_logprobs or 0) <= wire.MAX_TOP_LOGPROBS:
            bad("top_logprobs", f"top_logprobs must be in [0, {wire.MAX_TOP_LOGPROBS}]")
    elif req.logprobs is not None and not 0 <= req.logprobs <= wire.MAX_LOGPROBS:
        bad("logprobs", f"logprobs must be in [0, {wire.MAX_LOGPROBS}]")


def logprobs_of(req, chat: bool) -> int | None:
    """Top alternatives per token the request asks for; None: no logprobs."""
    if chat:
        return (req.top_logprobs or 0) if req.logprobs else None
    return req.logprobs


class Job:
    """One HTTP request: its n choices (``runs``, one ``Served`` each) and their ids."""

    def __init__(self, rid: str, chat: bool, req, t0: float):
        self.rid, self.chat, self.req, self.t0 = rid, chat, req, t0
        self.rids = [rid] if req.n == 1 else [f"{rid}-{i}" for i in range(req.n)]
        self.stops = [req.stop] if isinstance(req.stop, str) else list(req.stop or [])
        opts = req.stream_options
        self.include_usage = bool(opts is not None and opts.include_usage)
        self.runs: list[Served] = []
        self.started = False  # whether the first token came
        self.finished = False

    def first_token(self, metrics, at: float) -> None:
        """The first tokens of a choice were committed at ``at`` (``time.perf_counter``)."""
        if not self.started:
            self.started = True
            metrics.first_token(at - self.t0)


async def merged(gens: list) -> AsyncIterator:
    """Items of several async generators as they come; closing it closes them all."""
    queue: asyncio.Queue = asyncio.Queue()
    done = object()

    async def pump(gen):
        try:
            async with aclosing(gen) as items:
                async for item in items:
                    await queue.put(item)
            await queue.put(done)
        except Exception as e:
            await queue.put(e)

    tasks = [asyncio.create_task(pump(g)) for g in gens]
    try:
        left = len(tasks)
        while left:
            item = await queue.get()
            if isinstance(item, Exception):
                raise item
            if item is done:
                left -= 1
            else:
                yield item
    finally:
        for t in tasks:
            t.cancel()
        with anyio.CancelScope(shield=True):
            await asyncio.gather(*tasks, return_exceptions=True)
