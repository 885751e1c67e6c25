"""What a replica is handed and how it answers, without Ray: the routing text the prefix router
matches (`forwarded.routing_text`), and a request through an ASGI app in-process
(`exchange.exchange`): chunks handed on as the app sends them, a consumer that leaves cancels
the app's handler, an app that fails raises."""

from __future__ import annotations

import asyncio
import json

import pytest
from fastapi import FastAPI
from fastapi.responses import StreamingResponse

from runtime.ray_serve.exchange import exchange
from runtime.ray_serve.forwarded import (
    ROUTING_CHARS,
    ForwardedRequest,
    ResponseStart,
    routing_text,
)


def body(**fields: object) -> bytes:
    return json.dumps(fields).encode()


def test_routing_text_of_completions_and_chats():
    assert routing_text("/v1/completions", body(prompt="def f(x):")) == "def f(x):"
    assert routing_text("/v1/completions", body(prompt=["first", "second"])) == "first"
    ids = routing_text("/v1/completions", body(prompt=[5, 17, 3]))
    assert ids == "5,17,3," and routing_text(
        "/v1/completions", body(prompt=[5, 17, 3, 9])
    ).startswith(ids)  # a prefix of tokens is a prefix of the text
    chat = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}]
    first = routing_text("/v1/chat/completions", body(messages=chat[:1]))
    both = routing_text("/v1/chat/completions", body(messages=chat))
    assert both.startswith(first) and both == "system:be brief\nuser:hi\n"
    parts = [{"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text"}]}]
    assert routing_text("/v1/chat/completions", body(messages=parts)) == "user:a\n"
    long = routing_text("/v1/completions", body(prompt="x" * (ROUTING_CHARS + 10)))
    assert long == "x" * ROUTING_CHARS


def test_requests_without_a_prompt_have_no_routing_text():
    assert routing_text("/v1/models", b"") == ""
    assert routing_text("/health", body(prompt="x")) == ""
    assert routing_text("/v1/completions", b"{not json") == ""
    assert routing_text("/v1/completions", b"[1, 2]") == ""
    assert routing_text("/v1/completions", body(prompt=[])) == ""
    assert routing_text("/v1/chat/completions", body(messages="hi")) == ""


def forwarded(path: str, payload: bytes = b"") -> ForwardedRequest:
    headers = [(b"content-type", b"application/json")]
    return ForwardedRequest("POST", path, b"", headers, payload)


def test_exchange_hands_on_each_chunk_as_the_app_sends_it():
    app = FastAPI()
    go_on = asyncio.Event()  # the app's second chunk waits for the consumer to hold the first

    @app.post("/stream")
    async def stream() -> StreamingResponse:
        async def chunks():
            yield b"one"
            await go_on.wait()
            yield b"two"

        return StreamingResponse(chunks(), media_type="text/event-stream")

    async def consume() -> list[ResponseStart | bytes]:
        parts = []
        async for part in exchange(app, forwarded("/stream")):
            parts.append(part)
            if part == b"one":
                go_on.set()
        return parts

    start, *chunks = asyncio.run(asyncio.wait_for(consume(), timeout=10))
    assert isinstance(start, ResponseStart) and start.status == 200
    assert (b"content-type", b"text/event-stream; charset=utf-8") in start.headers
    assert chunks == [b"one", b"two"]


def test_a_consumer_that_leaves_cancels_the_handler():
    app = FastAPI()
    stopped = asyncio.Event()

    @app.post("/endless")
    async def endless() -> StreamingResponse:
        async def chunks():
            try:
                while True:
                    yield b"more"
                    await asyncio.sleep(0.01)
            finally:
                stopped.set()  # as a jmamba stream's close aborts its engine requests

        return StreamingResponse(chunks())

    async def leave_after_one() -> bool:
        parts = exchange(app, forwarded("/endless"))
        assert isinstance(await anext(parts), ResponseStart)
        assert await anext(parts) == b"more"
        await parts.aclose()
        await asyncio.wait_for(stopped.wait(), timeout=5)
        return stopped.is_set()

    assert asyncio.run(leave_after_one())


def test_a_json_answer_and_a_failing_app():
    app = FastAPI()

    @app.post("/echo")
    async def echo(payload: dict) -> dict:
        return {"got": payload}

    async def collect(path: str, payload: bytes) -> list[ResponseStart | bytes]:
        return [part async for part in exchange(app, forwarded(path, payload))]

    start, answer = asyncio.run(collect("/echo", body(a=1)))
    assert isinstance(start, ResponseStart) and start.status == 200
    assert json.loads(answer) == {"got": {"a": 1}}

    async def broken(scope, receive, send) -> None:
        raise RuntimeError("no answer")

    async def ask_broken() -> None:
        async for _ in exchange(broken, forwarded("/x")):
            pass

    with pytest.raises(RuntimeError, match="no answer"):
        asyncio.run(ask_broken())
