"""The HTTP ingress and orchestrator replica: OpenAI-compatible routes over the round loop.

A plain class whose ``asgi_app()`` builds a FastAPI app bound to it; ``cluster.app.build_app``
turns it into a Serve deployment and passes it the function that starts the two actors.
``cluster.guard`` checks the API key and the body size first. It validates every request before any
model runs (bad input is a 400, an unknown model a 404, a full server a 503, never a 500),
tokenises with the target's tokenizer, and streams rounds as SSE chunks.
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
from collections.abc import AsyncIterator
from contextlib import aclosing

import anyio
import ray
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, StreamingResponse
from starlette.background import BackgroundTask
from transformers import AutoTokenizer

from cluster import protocol as wire
from cluster.detokenize import TextStream
from cluster.guard import Guard, api_key
from cluster.orchestrator import Orchestrator, control
from cluster.schema import ServeArgs, Speculative
from specdec.engine.engine import Progress, check_pair, check_prompt
from specdec.engine.settings import GenerationParams, SpecSettings
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


class Server:
    def __init__(self, args: dict, spawn, observer=None):
        self.args = ServeArgs.model_validate(args)
        self.target, self.drafter = spawn(self.args)
        self.info = ray.get(self.target.info.remote())
        if self.drafter is not None:
            check_pair(self.info, ray.get(self.drafter.info.remote()))
        self.tokenizer = AutoTokenizer.from_pretrained(resolve(resolve_model_ref(self.args.target)))
        self.orchestrator = Orchestrator(self.target, self.drafter, self.info.eos_token_ids,
                                         observer)
        self.model_id = self.args.served_model_id
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
        app.add_middleware(Guard, key=api_key(self.args.api_key),
                           max_body_bytes=self.args.limits.max_body_bytes)
        return app

    async def health(self) -> dict:
        return {"status": "ok", "model": self.model_id, "in_flight": len(self.slots)}

    async def models(self) -> dict:
        return {"object": "list", "data": [{"id": self.model_id, "object": "model",
                                            "owned_by": "specdec",
                                            "max_model_len": self.info.max_length}]}

    async def completions(self, request: Request):
        return await self._serve(request, chat=False)

    async def chat_completions(self, request: Request):
        return await self._serve(request, chat=True)

    async def active(self) -> dict:
        """Request ids holding state in each actor (for tests and operators)."""
        drafter = [] if self.drafter is None else await control(self.drafter.active).remote()
        return {"target": await control(self.target.active).remote(), "drafter": drafter}

    async def actors(self) -> dict:
        """Process id and resident memory of each actor (for tests and operators)."""
        drafter = None if self.drafter is None else await control(self.drafter.process).remote()
        return {"target": await control(self.target.process).remote(), "drafter": drafter}

    async def metrics(self) -> dict:
        """Running totals of the metrics this replica exported (Prometheus has the rest)."""
        observer = self.orchestrator.observer
        return observer.snapshot() if observer is not None else {}

    # ---- one request ------------------------------------------------------------------------
    async def _serve(self, request: Request, chat: bool):
        self._start_reaper()
        try:
            req, prompt_ids, params = await self._validate(request, chat)
            rid = wire.new_id("chatcmpl" if chat else "cmpl")
            self._acquire(rid)
        except wire.ApiError as e:
            return JSONResponse(e.body(), status_code=e.status)
        progress = Progress(prompt_ids, params)
        if req.stream:
            # The slot is freed by the stream's end, or by the background task when a client
            # leaves before the first byte (the stream body then never starts).
            return ClosingStream(self._stream(rid, progress, chat),
                                 media_type="text/event-stream",
                                 background=BackgroundTask(self._release, rid))
        try:
            async for _ in self.orchestrator.run(rid, progress):
                pass
        except Exception as e:  # a failed or restarting actor: an error body, not a bare 500
            log.exception("request %s failed", rid)
            error = failure(e)
            return JSONResponse(error.body(), status_code=error.status)
        finally:
            self._release(rid)
        text = self.tokenizer.decode(progress.token_ids, skip_special_tokens=True)
        choice = wire.choice(chat, text, progress.token_ids, progress.finish_reason)
        return JSONResponse(wire.response(rid, chat, self.model_id, choice, self._totals(progress)))

    async def _stream(self, rid: str, progress: Progress, chat: bool) -> AsyncIterator[str]:
        text = TextStream(self.tokenizer)
        try:
            async with aclosing(self.orchestrator.run(rid, progress)) as rounds:
                async for new in rounds:
                    choice = wire.choice(chat, text.add(new), new, None, delta=True)
                    yield wire.sse(wire.response(rid, chat, self.model_id, choice, chunk=True))
            choice = wire.choice(chat, text.finish(), [], progress.finish_reason, delta=True)
            yield wire.sse(wire.response(rid, chat, self.model_id, choice,
                                         self._totals(progress), chunk=True))
        except Exception as e:  # headers are sent: report in-band, as OpenAI does
            log.exception("request %s failed mid-stream", rid)
            yield wire.sse(failure(e).body())
        finally:
            self._release(rid)
        yield wire.sse("[DONE]")

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

    def _totals(self, progress: Progress) -> dict:
        return {"usage": wire.usage(len(progress.prompt_ids), len(progress.token_ids)),
                "spec_decode": progress.stats.to_dict()}

    def _acquire(self, rid: str) -> None:
        if len(self.slots) >= self.args.limits.max_concurrent_requests:
            raise wire.ApiError(503, f"the server is at its limit of "
                                f"{self.args.limits.max_concurrent_requests} concurrent requests; "
                                "retry later", "server_overloaded", code="too_many_requests")
        self.slots.add(rid)

    def _release(self, rid: str) -> None:
        self.slots.discard(rid)  # idempotent: the stream and its background task both call it

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
        if req.n != 1:
            raise wire.ApiError(400, "only n=1 is supported", param="n", code="invalid_value")
        prompt_ids = self._encode(req, chat)
        return req, prompt_ids, self._params(req)

    def _encode(self, req, chat: bool) -> list[int]:
        param = "messages" if chat else "prompt"
        texts = [m.content for m in req.messages] if chat else [req.prompt]
        if not all(is_unicode(t) for t in texts if isinstance(t, str)):
            raise wire.ApiError(400, f"the {param} is not valid Unicode (a lone surrogate?)",
                                param=param, code="invalid_prompt")
        if chat:
            if not any(m.content.strip() for m in req.messages):
                raise wire.ApiError(400, "the messages are empty", param=param, code="empty_prompt")
            messages = [m.model_dump() for m in req.messages]
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

    def _params(self, req) -> GenerationParams:
        limits = self.args.limits
        max_tokens = req.max_tokens if req.max_tokens is not None else req.max_completion_tokens
        max_tokens = limits.default_max_tokens if max_tokens is None else max_tokens
        if not 1 <= max_tokens <= limits.max_tokens:
            raise wire.ApiError(400, f"max_tokens must be in [1, {limits.max_tokens}], got "
                                f"{max_tokens}", param="max_tokens", code="invalid_value")
        if req.temperature < 0:
            raise wire.ApiError(400, f"temperature must be >= 0, got {req.temperature}",
                                param="temperature", code="invalid_value")
        merged = {**self.args.speculative.model_dump(), **(req.speculative or {})}
        spec = wire.parse(Speculative, merged, prefix="speculative.")
        if spec.policy == "pacer" and self.args.preverifier is None:
            raise wire.ApiError(400, "policy pacer needs a pre-verifier; this server has none",
                                param="speculative.policy", code="invalid_value")
        try:
            return GenerationParams(max_tokens, req.temperature, req.seed,
                                    SpecSettings(**spec.model_dump()))
        except ValueError as e:
            raise wire.ApiError(400, str(e), param="speculative", code="invalid_value") from None
