"""The OpenAI-compatible wire format: request schemas, response bodies, SSE chunks, errors.

Requests are parsed strictly (wrong JSON types are 400s, not coerced) but tolerate the extra
fields OpenAI clients send. Every response and the last streamed chunk carry ``usage`` and a
``spec_decode`` object. This module knows nothing about models, Ray or the round loop.
"""

from __future__ import annotations

import json
import time
import uuid
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, ValidationError


class ApiError(Exception):
    """An error the client caused (or a busy server), rendered as OpenAI's error JSON."""

    def __init__(self, status: int, message: str, type: str = "invalid_request_error",
                 param: str | None = None, code: str | None = None):
        super().__init__(message)
        self.status, self.message, self.type, self.param, self.code = status, message, type, param, code

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.type, "param": self.param,
                          "code": self.code}}


class Request(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True)

    model: str
    max_tokens: int | None = None
    max_completion_tokens: int | None = None
    temperature: float = 0.0  # greedy by default: the lossless reference path
    seed: int = 0
    stream: bool = False
    n: int = 1
    speculative: dict[str, Any] | None = None  # per-request SD settings (see schema.Speculative)


class CompletionRequest(Request):
    prompt: str | list[int]


class Message(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True)

    role: Literal["system", "user", "assistant", "tool", "developer"]
    content: str


class ChatRequest(Request):
    messages: list[Message]


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


def choice(chat: bool, text: str, token_ids: list[int], finish_reason: str | None,
           delta: bool = False) -> dict:
    """One choice; ``token_ids`` is an extension that lets clients check tokens exactly."""
    body: dict = {"index": 0, "finish_reason": finish_reason, "token_ids": token_ids}
    if not chat:
        return {**body, "text": text, "logprobs": None}
    key = "delta" if delta else "message"
    return {**body, key: {"role": "assistant", "content": text}}


def response(rid: str, chat: bool, model: str, choice_: dict, extra: dict | None = None,
             chunk: bool = False) -> dict:
    kind = ("chat.completion" if chat else "text_completion") + (".chunk" if chunk and chat else "")
    return {"id": rid, "object": kind, "created": int(time.time()), "model": model,
            "choices": [choice_], **(extra or {})}


def sse(payload: dict | str) -> str:
    data = payload if isinstance(payload, str) else json.dumps(payload)
    return f"data: {data}\n\n"
