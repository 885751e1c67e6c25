"""The HTTP server: an OpenAI-compatible FastAPI app over one `AsyncEngine`.

Routes: `POST /v1/completions`, `POST /v1/chat/completions` (both streamed as server-sent events
with `stream: true`), `GET /v1/models`, `GET /health` (200 once the step variants are compiled,
503 before), `GET /metrics` (Prometheus). A body the server refuses gets a 400 with an
OpenAI-style error and never reaches the engine; a client that disconnects aborts its requests
(their blocks and slots go back); the server keeps serving either way.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import itertools
import re
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse

from runtime.core.sampling_params import SamplingParams
from runtime.llm import LLM
from runtime.serve.async_engine import AsyncEngine, EngineError
from runtime.serve.metrics import CONTENT_TYPE, Metrics
from runtime.serve.protocol import (
    BadRequest,
    ChatCompletionRequest,
    CompletionRequest,
    error_body,
)
from runtime.serve.responses import Decoder
from runtime.serve.streams import Completion


@dataclasses.dataclass
class Served:
    """What the handlers share: the model, its engine thread, the metrics."""

    llm: LLM
    engine: AsyncEngine
    model_name: str
    metrics: Metrics
    ids: itertools.count = dataclasses.field(default_factory=itertools.count)


def build_app(llm: LLM, model_name: str, startup: Callable[[], None] | None = None) -> FastAPI:
    """The app serving `llm` as `model_name`; `startup` runs on the engine thread first (the
    server reports ready after it)."""
    engine = AsyncEngine(llm.engine)
    served = Served(llm, engine, model_name, Metrics(engine))

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        engine.start(asyncio.get_running_loop(), startup)
        yield
        engine.stop()

    app = FastAPI(title="jmamba", lifespan=lifespan)
    app.state.served = served
    _add_error_handlers(app)
    _add_routes(app, served)
    return app


def _add_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(RequestValidationError)
    async def invalid_body(request: Request, error: RequestValidationError) -> JSONResponse:
        return JSONResponse(_validation_error(error), status_code=400)

    @app.exception_handler(ValueError)
    async def bad_value(request: Request, error: ValueError) -> JSONResponse:
        param = getattr(error, "param", None) or _named_param(str(error))
        return JSONResponse(error_body(str(error), param), status_code=400)

    @app.exception_handler(EngineError)
    async def engine_failed(request: Request, error: EngineError) -> JSONResponse:
        return JSONResponse(error_body(str(error), kind="server_error"), status_code=500)


def _validation_error(error: RequestValidationError) -> dict[str, Any]:
    """The first problem pydantic found, as an OpenAI error naming the field."""
    first = error.errors()[0] if error.errors() else {}
    if first.get("type") == "json_invalid":
        return error_body("the request body is not valid JSON")
    location = [part for part in first.get("loc", ()) if part != "body"]
    param = str(location[0]) if location else None
    message = str(first.get("msg", error))
    return error_body(f"{param}: {message}" if param else message, param)


def _named_param(message: str) -> str | None:
    """The field a `SamplingParams` / request check names first ("max_tokens=-1 must ...")."""
    match = re.match(r"(\w+)=", message)
    return match.group(1) if match else None


def _add_routes(app: FastAPI, served: Served) -> None:
    @app.get("/health")
    async def health() -> JSONResponse:
        if served.engine.failure is not None:
            failed = {"status": "failed", "error": str(served.engine.failure)}
            return JSONResponse(failed, status_code=503)
        if served.engine.ready.is_set():
            return JSONResponse({"status": "ok"})
        return JSONResponse({"status": "starting"}, status_code=503)

    @app.get("/metrics")
    async def metrics() -> Response:
        return Response(served.metrics.text(), media_type=CONTENT_TYPE)

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        card = {
            "id": served.model_name,
            "object": "model",
            "created": int(time.time()),
            "owned_by": "jmamba",
            "max_model_len": served.llm.engine.config.max_model_len,
        }
        return {"object": "list", "data": [card]}

    @app.post("/v1/completions")
    async def completions(body: CompletionRequest, request: Request) -> Response:
        _check_ready_and_model(served, body.model)
        prompts = [_token_ids(served.llm, prompt) for prompt in body.prompts()]
        params = body.sampling_params(body.max_tokens or 16, body.logprobs)
        completion = _start(served, "cmpl", prompts, params, body.n, body.include_usage)
        return await _respond(completion, body.stream, request, chat=False)

    @app.post("/v1/chat/completions")
    async def chat(body: ChatCompletionRequest, request: Request) -> Response:
        _check_ready_and_model(served, body.model)
        text = served.llm.render_chat(body.conversation())
        prompt = _token_ids(served.llm, text)
        room = served.llm.engine.config.max_model_len - len(prompt)
        params = body.sampling_params(body.answer_tokens or max(room, 1), body.logprobs_k)
        completion = _start(served, "chatcmpl", [prompt], params, body.n, body.include_usage)
        return await _respond(completion, body.stream, request, chat=True)


def _check_ready_and_model(served: Served, model: str) -> None:
    if not served.engine.ready.is_set():
        raise EngineError("the server is starting (compiling its step variants): try again")
    if model != served.model_name:
        raise BadRequest(f"model={model!r} is not served here: {served.model_name!r} is", "model")


def _token_ids(llm: LLM, prompt: str | list[int]) -> list[int]:
    if isinstance(prompt, str):
        if llm.tokenizer is None:
            raise BadRequest("text prompts need a tokenizer: send token ids", "prompt")
        return llm.tokenizer.encode(prompt).ids
    return list(prompt)


def _start(
    served: Served,
    kind: str,
    prompts: list[list[int]],
    params: SamplingParams,
    n: int,
    include_usage: bool,
) -> Completion:
    """Check every (prompt, choice) first, then submit them all: a bad one submits none."""
    jobs = []
    for prompt in prompts:
        for i in range(n):
            choice_params = _with_seed(params, i)
            jobs.append(served.llm.engine.check_request(prompt, choice_params))
    served.llm.engine.drafter.check(params)
    streams = [served.engine.submit(prompt, choice_params)[1] for prompt, choice_params in jobs]
    prompt_tokens = sum(len(prompt) for prompt in prompts)
    served.metrics.prompt_tokens.inc(prompt_tokens * n)
    return Completion(
        f"{kind}-{next(served.ids)}",
        served.model_name,
        streams,
        prompt_tokens,
        include_usage,
        params.logprobs,
        served.metrics,
        Decoder(served.llm.tokenizer),
    )


def _with_seed(params: SamplingParams, choice: int) -> SamplingParams:
    """Choice i of a seeded request samples with seed + i (distinct, reproducible choices)."""
    if params.seed is None or choice == 0:
        return params
    return dataclasses.replace(params, seed=(params.seed + choice) % 2**32)


async def _respond(completion: Completion, stream: bool, request: Request, chat: bool) -> Response:
    if stream:
        chunks = completion.sse(chat)
        return StreamingResponse(chunks, media_type="text/event-stream")
    collected = asyncio.create_task(completion.collect(chat))
    while not collected.done():
        await asyncio.wait({collected}, timeout=0.25)
        if not collected.done() and await request.is_disconnected():
            collected.cancel()  # its streams' requests are aborted as they unwind
            with contextlib.suppress(asyncio.CancelledError):
                await collected
            return Response(status_code=499)
    return JSONResponse(collected.result())
