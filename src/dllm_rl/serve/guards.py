"""The guards in front of the application, pure ASGI middlewares that look at a request before anything reads its
body: :class:`BodyLimit` (outermost: ``--max-request-bytes``), then :class:`KeyCheck` (``--api-key``, on the /v1
routes). A refusal closes the connection (``Connection: close``), so the server stops reading what the client sends.

Hand-written rather than Starlette's ``RequestBodyLimitMiddleware`` (or FastAPI's ``max_body_size``, built on it):
those look at the declared length only when the application reads the body, answer in their own shapes (plain text,
``{"detail": ...}``) rather than OpenAI's error, and keep the connection open for the rest of the body. Here a
declared ``Content-Length`` over the limit is answered before the application runs, and a body without one (chunked)
is counted as its pieces arrive and refused at the piece that crosses the limit. The key is checked here rather than
as a route dependency because FastAPI reads and parses a body before it runs the route's dependencies; and in a pure
ASGI middleware, not Starlette's ``BaseHTTPMiddleware``, which would hide a departed client from
``request.is_disconnected``: a guard that lets a request through hands on ``receive`` as it is (:class:`KeyCheck`)
or only counts what it returns (:class:`BodyLimit`).
"""

from __future__ import annotations

import secrets
from collections.abc import Callable
from typing import Any

from starlette.responses import Response

Message = dict[str, Any]
ASGIApp = Callable[..., Any]


def header(scope: dict, name: bytes) -> bytes | None:
    """The request's header ``name`` (lower case), as sent."""
    return next((value for key, value in scope.get("headers", ()) if key.lower() == name), None)


async def refuse(scope: dict, send: Callable, response: Response) -> None:
    """Answer with ``response`` and close the connection (the body, read or not, is left)."""
    async def nothing() -> Message:
        return {"type": "http.disconnect"}

    response.headers["connection"] = "close"
    await response(scope, nothing, send)


class BodyLimit:
    """Answer an HTTP request whose body exceeds ``max_bytes`` with ``too_large()`` (a response, made for each
    refusal: it may count it) and let the application see a client that left; everything else passes
    through untouched."""

    def __init__(self, app: ASGIApp, max_bytes: int, too_large: Callable[[], Response]):
        self.app, self.max_bytes, self.too_large = app, max_bytes, too_large

    async def __call__(self, scope: dict, receive: Callable, send: Callable) -> None:
        if scope["type"] != "http":  # lifespan (and anything else) as it is
            await self.app(scope, receive, send)
            return
        try:
            declared = int(header(scope, b"content-length") or -1)  # (the HTTP server refuses a malformed one)
        except ValueError:
            declared = -1
        if declared > self.max_bytes:  # refused before the application runs
            await refuse(scope, send, self.too_large())
            return
        seen, started, refused = 0, False, False

        async def counted() -> Message:
            nonlocal seen, refused
            if refused:
                return {"type": "http.disconnect"}
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > self.max_bytes:  # a chunked body crossed the limit: answer, and the client "left"
                    refused = True
                    if not started:
                        await refuse(scope, send, self.too_large())
                    return {"type": "http.disconnect"}
            return message

        async def watched(message: Message) -> None:
            nonlocal started
            if refused:  # the refusal has answered: what the application sends after it is dropped
                return
            started = started or message["type"] == "http.response.start"
            await send(message)

        await self.app(scope, counted, watched)


class KeyCheck:
    """With an API key (``key``), a request to a path under ``prefix`` must carry ``Authorization: Bearer <key>``
    (the scheme case-blind, compared in constant time); otherwise it is answered ``unauthorized()`` (a response,
    made for each refusal) before its body is read. Without a key, or on other paths, everything passes."""

    def __init__(self, app: ASGIApp, key: str | None, unauthorized: Callable[[], Response], prefix: str = "/v1/"):
        self.app, self.key, self.unauthorized, self.prefix = app, key, unauthorized, prefix

    async def __call__(self, scope: dict, receive: Callable, send: Callable) -> None:
        if self.key is not None and scope["type"] == "http" and scope["path"].startswith(self.prefix):
            scheme, _, given = (header(scope, b"authorization") or b"").partition(b" ")
            if scheme.lower() != b"bearer" or not secrets.compare_digest(given.strip(), self.key.encode()):
                await refuse(scope, send, self.unauthorized())
                return
        await self.app(scope, receive, send)
