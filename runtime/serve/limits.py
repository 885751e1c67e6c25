"""The server's limits and their answers: a request body over `max_request_bytes` gets a 413
(`BodyLimit`, before any of it is parsed), more than `max_choices_per_request` choices (prompts x
n) a 400, a prompt of `max_model_len` tokens or more a 400, and a request that would hold more
than `max_queued_requests` choices beyond what the engine runs at once a 503 with `Retry-After`:
an overloaded server sheds new work and keeps serving what it took.
"""

from __future__ import annotations

import dataclasses

from starlette.datastructures import Headers
from starlette.exceptions import HTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from runtime.serve.errors import BadRequest, Unavailable, error_response

OVERLOADED_RETRY_SECONDS = 1  # a queue drains in about a request's time: come back soon


@dataclasses.dataclass(frozen=True)
class Limits:
    """What one request may ask of the server (`jmamba serve --max-request-bytes` etc.)."""

    max_request_bytes: int = 16 * 2**20
    max_choices_per_request: int = 256
    max_queued_requests: int = 1024

    def __post_init__(self) -> None:
        for field in dataclasses.fields(self):
            if getattr(self, field.name) < 1:
                raise ValueError(f"{field.name}={getattr(self, field.name)} must be >= 1")

    def check_choices(self, num_prompts: int, n: int) -> None:
        """400 when prompts x n is more than a request may ask for."""
        if num_prompts * n > self.max_choices_per_request:
            raise BadRequest(
                f"{num_prompts} prompts x n={n} is {num_prompts * n} choices: at most "
                f"{self.max_choices_per_request} per request (--max-choices-per-request)",
                "n",
            )

    def check_room(self, held: int, choices: int, running: int) -> None:
        """503 when `choices` more than the `held` ones (live or being prepared) would queue
        more than `max_queued_requests` beyond the `running` the engine steps at once. An idle
        server takes any one request (its choices are bounded by `check_choices`)."""
        if held and held + choices > running + self.max_queued_requests:
            raise Unavailable(
                f"the server is overloaded: {held} requests held, at most {running} running "
                f"and {self.max_queued_requests} queued (--max-queued-requests); try again",
                OVERLOADED_RETRY_SECONDS,
                "overloaded",
            )


def check_prompt_tokens(num_tokens: int, max_model_len: int, param: str) -> None:
    """400 for a prompt the engine could not take, where the prompt is made: the engine's own
    check walks every id on the engine thread, which a prompt of millions of tokens would stall
    for every stream (it gives the same answer for any shorter prompt it refuses)."""
    if num_tokens >= max_model_len:
        raise BadRequest(
            f"{param} has {num_tokens} tokens: with max_model_len={max_model_len} it leaves no "
            f"room to generate (at most {max_model_len - 1})",
            param,
        )


class BodyLimit:
    """ASGI middleware: a request body over `max_bytes` gets a 413 in OpenAI's shape, at once
    when its Content-Length says so (uvicorn discards the unread body), else as it arrives."""

    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        self.app, self.max_bytes = app, max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = Headers(scope=scope).get("content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.max_bytes:
            await error_response(413, self._message(int(declared)))(scope, receive, send)
            return
        received = 0

        async def limited() -> Message:
            nonlocal received
            message = await receive()
            received += len(message.get("body", b""))
            if received > self.max_bytes:  # FastAPI passes an HTTPException on as it is
                raise HTTPException(413, self._message(received))
            return message

        await self.app(scope, limited, send)

    def _message(self, size: int) -> str:
        return (
            f"the request body is {size} bytes or more: at most {self.max_bytes} "
            "(--max-request-bytes)"
        )
