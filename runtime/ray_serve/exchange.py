"""`exchange`: one forwarded HTTP request answered by an ASGI app in this process, its response
as parts (a `ResponseStart`, then body chunks), as they are sent.

A replica answers with `jmamba serve`'s own FastAPI app, unchanged, so every route, limit, error
and stream is the one implementation the single server has. httpx's ASGI transport would do the
same but collects the whole body before returning it, which would hold a stream's chunks back
until its last one; this feeds the app the request body once and hands each `send` on at once.

A consumer that stops early (the client left, the ingress cancelled the call) cancels the app's
handler, which is how the app hears of a disconnect anyway: its streams close and the engine
aborts their requests. An app that fails before it answers raises here.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

from starlette.types import ASGIApp, Message

from runtime.ray_serve.forwarded import ForwardedRequest, ResponseStart

# ASGI spec 2.3: Starlette's streaming responses then listen for `http.disconnect` themselves.
_ASGI = {"version": "3.0", "spec_version": "2.3"}


def http_scope(request: ForwardedRequest) -> dict[str, Any]:
    """The ASGI scope of `request`, as a server in front of the app would make it."""
    return {
        "type": "http",
        "asgi": _ASGI,
        "http_version": "1.1",
        "method": request.method,
        "scheme": "http",
        "path": request.path,
        "raw_path": request.path.encode(),
        "root_path": "",
        "query_string": request.query,
        "headers": request.headers,
        "client": ("127.0.0.1", 0),
        "server": ("127.0.0.1", 0),
    }


async def exchange(app: ASGIApp, request: ForwardedRequest) -> AsyncIterator[ResponseStart | bytes]:
    """`request` through `app`: its `ResponseStart`, then its non-empty body chunks."""
    sent: asyncio.Queue[Message | None] = asyncio.Queue()
    left = asyncio.Event()  # set when the consumer stops: later receives get a disconnect
    body = [{"type": "http.request", "body": request.body, "more_body": False}]

    async def receive() -> Message:
        if body:
            return body.pop()
        await left.wait()
        return {"type": "http.disconnect"}

    async def send(message: Message) -> None:
        await sent.put(message)

    async def answer() -> None:
        try:
            await app(http_scope(request), receive, send)
        finally:
            await sent.put(None)

    task = asyncio.create_task(answer())
    complete = False
    try:
        while not complete:
            message = await sent.get()
            if message is None:
                break  # the app returned (or failed) without finishing a response
            part, complete = _part(message)
            if part:
                yield part
        await task  # raises the app's error, if it failed
        if not complete:
            raise RuntimeError(f"{request.method} {request.path}: the app sent no whole response")
    finally:
        if not task.done():  # the consumer left before the response ended
            left.set()
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)


def _part(message: Message) -> tuple[ResponseStart | bytes | None, bool]:
    """What one `send` message adds to the response, and whether the response is complete."""
    if message["type"] == "http.response.start":
        return ResponseStart(message["status"], list(message.get("headers", []))), False
    if message["type"] == "http.response.body":
        return message.get("body", b"") or None, not message.get("more_body", False)
    return None, False
