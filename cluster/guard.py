"""The server's gate: an ASGI middleware that checks the API key and caps the request body
before any route runs.

With a key configured, every route except ``/health`` (and ``/metrics`` when the config makes
it public) answers 401 (OpenAI's error JSON) unless
the request carries ``Authorization: Bearer <key>``. A body larger than the cap is refused with
413, whether it declares its length or streams in chunks; a body under the cap is read once
and replayed to the app. This module knows nothing about models or the round loop.
"""

from __future__ import annotations

import hmac
import json
import os

from cluster.protocol import ApiError

OPEN_PATHS = frozenset({"/health"})  # answer without a key (load balancers probe them)
KEY_ENV = "SPECDEC_API_KEY"


def api_key(configured: str | None, environ=os.environ) -> str | None:
    """The key the server requires: the config's, else ``$SPECDEC_API_KEY``; None when neither
    is set (or set empty)."""
    return configured or environ.get(KEY_ENV) or None


class Guard:
    def __init__(self, app, key: str | None, max_body_bytes: int,
                 open_paths: frozenset[str] = OPEN_PATHS):
        self.app = app
        self.key = key
        self.max_body_bytes = max_body_bytes
        self.open_paths = open_paths

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        if self.key is not None and route(scope) not in self.open_paths and not self.authorised(scope):
            return await reply(send, ApiError(401, "a valid API key is required: send "
                                              "'Authorization: Bearer <key>'",
                                              code="invalid_api_key"))
        if declared_length(scope) > self.max_body_bytes:
            return await reply(send, self.too_large())
        body = await read_body(receive, self.max_body_bytes)
        if body is None:
            return await reply(send, self.too_large())
        return await self.app(scope, replay(body, receive), send)

    def authorised(self, scope) -> bool:
        given = header(scope, b"authorization")
        scheme, _, token = given.partition(" ")
        return scheme.lower() == "bearer" and hmac.compare_digest(token.strip().encode(),
                                                                  self.key.encode())

    def too_large(self) -> ApiError:
        return ApiError(413, f"the request body exceeds {self.max_body_bytes} bytes",
                        code="request_too_large")


def route(scope) -> str:
    """The path below the app's route prefix (Serve passes the prefix as ``root_path``)."""
    path, root = scope["path"], scope.get("root_path", "").rstrip("/")
    if root and path.startswith(root):
        return path[len(root):] or "/"
    return path


def header(scope, name: bytes) -> str:
    for key, value in scope.get("headers", []):
        if key.lower() == name:
            return value.decode("latin-1")
    return ""


def declared_length(scope) -> int:
    try:
        return int(header(scope, b"content-length") or 0)
    except ValueError:
        return 0


async def read_body(receive, limit: int) -> bytes | None:
    """The whole body, or None as soon as it exceeds ``limit`` bytes."""
    chunks, size = [], 0
    while True:
        message = await receive()
        if message["type"] != "http.request":
            return b"".join(chunks)  # the client left; the app will see the disconnect
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            return None
        chunks.append(chunk)
        if not message.get("more_body", False):
            return b"".join(chunks)


def replay(body: bytes, receive):
    """A ``receive`` that yields ``body`` once, then defers to the real one (disconnects)."""
    sent = False

    async def receive_again():
        nonlocal sent
        if sent:
            return await receive()
        sent = True
        return {"type": "http.request", "body": body, "more_body": False}

    return receive_again


async def reply(send, error: ApiError) -> None:
    body = json.dumps(error.body()).encode()
    await send({"type": "http.response.start", "status": error.status,
                "headers": [(b"content-type", b"application/json"),
                            (b"content-length", str(len(body)).encode())]})
    await send({"type": "http.response.body", "body": body})
