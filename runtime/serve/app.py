"""The HTTP server: an OpenAI-compatible FastAPI app over one `AsyncEngine`.

Routes: `POST /v1/completions`, `POST /v1/chat/completions` (both streamed as server-sent events
with `stream: true`), `GET /v1/models`, `GET /health` (200 once the model is loaded and the
warm-up variants compiled, 503 before), `GET /metrics` (Prometheus). The routes answer from the
start, before the model is loaded (`startup.py`: 503 with `Retry-After` meanwhile). Every error
is in OpenAI's shape (`errors.py`); a body passes the limits (`limits.py`) and, with an API key,
the key check (`auth.py`); the handlers hand a checked body to the front door (`intake.py`) and
stream what it starts. A client that disconnects aborts its requests (their blocks and slots go
back); the server keeps serving either way.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from runtime.llm import LLM
from runtime.serve.auth import ApiKey
from runtime.serve.errors import BadRequest, add_error_handlers
from runtime.serve.limits import BodyLimit, Limits
from runtime.serve.metrics import CONTENT_TYPE, CountRejections, Metrics
from runtime.serve.protocol import ChatCompletionRequest, CompletionRequest
from runtime.serve.startup import Startup
from runtime.serve.streams import Completion
from runtime.serve.tool_parsers import ToolParser

DISCONNECT_POLL_SECONDS = 0.25  # how often a whole (unstreamed) response checks its client


def build_app(
    model: LLM | Callable[[], LLM],
    model_name: str,
    warmup: Callable[[LLM], None] | None = None,
    *,
    limits: Limits | None = None,
    api_key: str | None = None,
    on_failure: Callable[[BaseException], None] | None = None,
    tool_parser: ToolParser | None = None,
) -> FastAPI:
    """The app serving `model` (an `LLM`, or a function that loads one: it runs in a thread once
    the server starts) as `model_name`; `warmup` runs on the engine thread before the server
    reports ready; `api_key` guards the `/v1` routes; `on_failure` hears of a failed load;
    `tool_parser` reads chat answers for tool calls (None: none, `NoToolParser`)."""
    load = model if callable(model) else lambda: model
    metrics = Metrics()
    startup = Startup(
        load, warmup, limits or Limits(), metrics, model_name, on_failure, tool_parser
    )

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        startup.begin(asyncio.get_running_loop())
        yield
        startup.stop()

    app = FastAPI(title="jmamba", lifespan=lifespan)
    app.state.startup = startup
    add_error_handlers(app)
    _add_routes(app, startup, metrics)
    # Outermost last: rejections are counted for every answer, the key checked before the body.
    app.add_middleware(BodyLimit, max_bytes=startup.limits.max_request_bytes)
    if api_key is not None:
        app.add_middleware(ApiKey, key=api_key)
    app.add_middleware(CountRejections, metrics=metrics)
    return app


def _add_routes(app: FastAPI, startup: Startup, metrics: Metrics) -> None:
    @app.get("/health")
    async def health() -> JSONResponse:
        status, body, headers = startup.health()
        return JSONResponse(body, status_code=status, headers=headers)

    @app.get("/metrics")
    async def scrape() -> Response:
        return Response(metrics.text(), media_type=CONTENT_TYPE)

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        intake = startup.front_door()
        card = {
            "id": startup.model_name,
            "object": "model",
            "created": int(time.time()),
            "owned_by": "jmamba",
            "max_model_len": intake.max_model_len,
        }
        return {"object": "list", "data": [card]}

    @app.post("/v1/completions")
    async def completions(body: CompletionRequest, request: Request) -> Response:
        intake = startup.front_door()
        _check_model(startup, body.model)
        completion = await intake.completion(body)
        return await _respond(completion, body.stream, request, chat=False)

    @app.post("/v1/chat/completions")
    async def chat(body: ChatCompletionRequest, request: Request) -> Response:
        intake = startup.front_door()
        _check_model(startup, body.model)
        completion = await intake.chat(body)
        return await _respond(completion, body.stream, request, chat=True)


def _check_model(startup: Startup, model: str) -> None:
    if model != startup.model_name:
        raise BadRequest(f"model={model!r} is not served here: {startup.model_name!r} is", "model")


async def _respond(completion: Completion, stream: bool, request: Request, chat: bool) -> Response:
    if stream:
        chunks = completion.sse(chat)
        return StreamingResponse(chunks, media_type="text/event-stream")
    collected = asyncio.create_task(completion.collect(chat))
    while not collected.done():
        await asyncio.wait({collected}, timeout=DISCONNECT_POLL_SECONDS)
        if not collected.done() and await request.is_disconnected():
            collected.cancel()  # its streams' requests are aborted as they unwind
            with contextlib.suppress(asyncio.CancelledError):
                await collected
            return Response(status_code=499)
    return JSONResponse(collected.result())
