"""The OpenAI-compatible wire format: request schemas, response bodies, SSE chunks, errors.

Requests are parsed strictly: wrong JSON types are 400s (not coerced), and so are unknown fields
and OpenAI fields this server does not implement, each naming the field; nothing is dropped
silently. Every choice carries its own ``spec_decode`` object (for n == 1 the response has it
at the top level too). This module knows nothing about models, Ray or the round loop.
"""

from __future__ import annotations

import json
import time
import uuid
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, ValidationError

from cluster.schema import Speculative


class ApiError(Exception):
    """An error the client caused (or a busy server), rendered as OpenAI's error JSON."""

    def __init__(self, status: int, message: str, type: str = "invalid_request_error",
                 param: str | None = None, code: str | None = None):
        super().__init__(message)
        self.status, self.message, self.type, self.param, self.code = status, message, type, param, code

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.type, "param": self.param,
                          "code": self.code}}


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    include_usage: bool = False  # a last chunk with ``usage`` and empty ``choices``


class Request(BaseModel):
    """Fields common to both routes. Every field of OpenAI's schemas is declared: the honoured
    ones typed, the others as ``Any`` and refused by ``refuse_unsupported`` unless they carry
    their neutral value; anything else is an unknown field, refused by ``extra="forbid"``."""

    model_config = ConfigDict(extra="forbid", strict=True)

    model: str
    max_tokens: int | None = None  # default: the context left after the prompt (capped)
    temperature: float = 0.0  # greedy by default: the lossless reference path
    top_p: float = 1.0
    top_k: int = 0  # vLLM's extension; 0 or -1: off
    min_p: float = 0.0  # vLLM's extension
    seed: int | None = None  # None: a random seed per request
    stream: bool = False
    stream_options: StreamOptions | None = None
    n: int = 1
    stop: str | list[str] | None = None
    stop_token_ids: list[int] | None = None  # vLLM's extension
    user: str | None = None  # accepted; identifies the end user in logs only
    speculative: Speculative | None = None  # per-request SD settings, over the server's
    # OpenAI fields this server does not implement: refused unless neutral (see NEUTRAL)
    frequency_penalty: Any = None
    presence_penalty: Any = None
    logit_bias: Any = None


class CompletionRequest(Request):
    prompt: str | list[int]
    logprobs: int | None = None  # top alternatives per token, 0..MAX_LOGPROBS
    echo: Any = None
    best_of: Any = None
    suffix: Any = None


class TextPart(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    type: Literal["text"]
    text: str


class Message(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    role: Literal["system", "user", "assistant", "tool", "developer"]
    content: str | list[TextPart]

    @property
    def text(self) -> str:
        return self.content if isinstance(self.content, str) else "".join(
            p.text for p in self.content)


class ChatRequest(Request):
    messages: list[Message]
    max_completion_tokens: int | None = None
    logprobs: bool = False
    top_logprobs: int | None = None  # 0..MAX_TOP_LOGPROBS, needs logprobs=true
    metadata: dict[str, str] | None = None  # accepted; not stored (``store`` is refused)
    tools: Any = None
    tool_choice: Any = None
    parallel_tool_calls: Any = None
    functions: Any = None
    function_call: Any = None
    response_format: Any = None
    audio: Any = None
    modalities: Any = None
    prediction: Any = None
    reasoning_effort: Any = None
    web_search_options: Any = None
    store: Any = None
    service_tier: Any = None
    verbosity: Any = None
    prompt_cache_key: Any = None
    safety_identifier: Any = None


MAX_STOPS = 4  # OpenAI's limit on ``stop``
MAX_LOGPROBS = 5  # completions: OpenAI's limit
MAX_TOP_LOGPROBS = 20  # chat: OpenAI's limit

# The fields declared but not implemented, and the values that ask for nothing (accepted).
NEUTRAL: dict[str, tuple] = {
    "frequency_penalty": (None, 0, 0.0), "presence_penalty": (None, 0, 0.0),
    "logit_bias": (None, {}), "echo": (None, False), "suffix": (None, ""),
    "tools": (None, []), "tool_choice": (None, "none"), "parallel_tool_calls": (None, True, False),
    "functions": (None, []), "function_call": (None, "none"),
    "response_format": (None, {"type": "text"}), "audio": (None,),
    "modalities": (None, ["text"]), "prediction": (None,), "reasoning_effort": (None,),
    "web_search_options": (None,), "store": (None, False),
    "service_tier": (None, "auto", "default"), "verbosity": (None,),
    "prompt_cache_key": (None,), "safety_identifier": (None,),
}


def _is_neutral(value, allowed: tuple) -> bool:
    # type-exact: True == 1 and 1 == 1.0 in Python, but {"x": true} must not pass for {"x": 1}
    return any(type(value) is type(a) and value == a for a in allowed)


def refuse_unsupported(req: Request) -> None:
    """A 400 naming the first field that asks for something this server does not do."""
    for name, allowed in NEUTRAL.items():
        if name in req.model_fields_set and not _is_neutral(getattr(req, name), allowed):
            raise ApiError(400, f"{name} is not supported by this server (accepted only as "
                           f"{' or '.join(json.dumps(a) for a in allowed)})", param=name,
                           code="unsupported_parameter")
    best_of = getattr(req, "best_of", None)
    if best_of is not None and not (type(best_of) is int and best_of == req.n):
        raise ApiError(400, "best_of is not supported by this server (accepted only equal to n)",
                       param="best_of", code="unsupported_parameter")


def parse(model: type[BaseModel], body: Any, prefix: str = "") -> BaseModel:
    """Validate a JSON body; the first problem becomes a 400 naming the offending field."""
    try:
        return model.model_validate(body, strict=True)
    except ValidationError as e:
        first = e.errors()[0]
        param = prefix + ".".join(str(p) for p in first["loc"])
        raise ApiError(400, f"{param or 'body'}: {first['msg']}", param=param or None,
                       code="invalid_value") from None


def openapi_body(model: type[BaseModel]) -> dict:
    """``openapi_extra`` for a route that reads its JSON body itself: documents ``model`` as the
    request body (with nested models inlined), so clients and fuzzers see the schema while the
    route keeps its own validation and error format."""
    schema = model.model_json_schema()
    defs = schema.pop("$defs", {})
    body = {"required": True, "content": {"application/json": {"schema": _inline(schema, defs)}}}
    return {"requestBody": body}


def _inline(node, defs: dict):
    if isinstance(node, dict):
        if "$ref" in node:
            return _inline(defs[node["$ref"].rsplit("/", 1)[-1]], defs)
        return {k: _inline(v, defs) for k, v in node.items()}
    if isinstance(node, list):
        return [_inline(v, defs) for v in node]
    return node


def new_id(kind: str) -> str:
    return f"{kind}-{uuid.uuid4().hex[:24]}"


def usage(prompt_tokens: int, completion_tokens: int) -> dict:
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens}


def choice(chat: bool, index: int, text: str, token_ids: list[int], finish_reason: str | None,
           delta: bool = False, logprobs: dict | None = None, stats: dict | None = None) -> dict:
    """One choice; ``token_ids`` is an extension that lets clients check tokens exactly, and
    ``spec_decode`` (on the choice's last chunk) its speculative-decoding stats."""
    body: dict = {"index": index, "finish_reason": finish_reason, "token_ids": token_ids,
                  "logprobs": logprobs}
    if stats is not None:
        body["spec_decode"] = stats
    if not chat:
        return {**body, "text": text}
    key = "delta" if delta else "message"
    return {**body, key: {"role": "assistant", "content": text}}


def completion_logprobs(tokens: list[str], logprobs: list[float],
                        top: list[list[tuple[str, float]]], offset: int) -> dict:
    """The completions route's ``logprobs`` object; ``offset``: text length before the first token
    (``text_offset`` adds up the token strings)."""
    offsets = []
    for t in tokens:
        offsets.append(offset)
        offset += len(t)
    top_dicts = [{s: lp for s, lp in reversed(alts)} for alts in top]  # the likelier wins a clash
    return {"tokens": tokens, "token_logprobs": logprobs, "top_logprobs": top_dicts,
            "text_offset": offsets}


def chat_logprobs(tokens: list[str], logprobs: list[float],
                  top: list[list[tuple[str, float]]]) -> dict:
    """The chat route's ``logprobs`` object: one entry per token with its top alternatives."""
    def entry(s: str, lp: float) -> dict:
        return {"token": s, "logprob": lp, "bytes": list(s.encode("utf-8", "replace"))}

    content = [{**entry(s, lp), "top_logprobs": [entry(a, alp) for a, alp in alts]}
               for s, lp, alts in zip(tokens, logprobs, top, strict=True)]
    return {"content": content, "refusal": None}


def response(rid: str, chat: bool, model: str, choices: list[dict], extra: dict | None = None,
             chunk: bool = False) -> dict:
    kind = ("chat.completion" if chat else "text_completion") + (".chunk" if chunk and chat else "")
    return {"id": rid, "object": kind, "created": int(time.time()), "model": model,
            "choices": choices, **(extra or {})}


def sse(payload: dict | str) -> str:
    data = payload if isinstance(payload, str) else json.dumps(payload)
    return f"data: {data}\n\n"
