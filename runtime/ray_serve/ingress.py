"""`Ingress`: the HTTP front of the deployment, one Ray Serve replica that hands each request to
a jmamba replica chosen by the deployment's request router, and streams the answer back.

It parses nothing of the API: it reads the body, takes its routing text (`forwarded.py`) and
passes the request on whole (`JmambaReplica.forward`), so the replicas' app answers every route
and error as `jmamba serve` does. A request with routing text goes as the call's positional
argument, which is where the prefix-affinity router looks for a `prompt`; one without (`/health`,
`/v1/models`, `/metrics`, a body that is not JSON) goes as a keyword argument, which that router
leaves to its power-of-two-choices fallback (an empty text would divide by zero in its match
rate).

A replica that dies (its process killed, its node lost) fails the requests it was answering and
none hangs: before the answer started, the client gets a 503 in OpenAI's error shape (the
`openai` client retries it, and Serve's router, told of the death by the failed call, routes the
retry elsewhere); mid-stream, the server-sent events end with an error event and `[DONE]`, which
the `openai` client raises as an `APIError`. A client that leaves cancels the replica's call,
which aborts its engine requests.
"""

# No `from __future__ import annotations`: Serve's class-based view rebuilds the routes'
# signatures, and FastAPI must see `Request` itself there, not the string "Request".
import json
import logging
from collections.abc import AsyncIterator
from typing import cast

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from ray import serve
from ray.exceptions import RayActorError
from ray.serve.handle import DeploymentHandle, DeploymentResponseGenerator

from runtime.ray_serve.forwarded import ForwardedRequest, ResponseStart, routing_text
from runtime.serve.errors import error_body

log = logging.getLogger(__name__)

# Hop-by-hop headers of the replica's answer: the ingress's own server sets its framing.
_HOP_BY_HOP = {b"connection", b"keep-alive", b"transfer-encoding"}
METHODS = ["GET", "POST", "PUT", "DELETE", "PATCH", "HEAD", "OPTIONS"]


async def _forwarded(request: Request) -> ForwardedRequest:
    body = await request.body()
    path = request.url.path
    return ForwardedRequest(
        method=request.method,
        path=path,
        query=request.scope.get("query_string", b""),
        headers=list(request.scope["headers"]),
        body=body,
        prompt=routing_text(path, body),
    )


async def _body(parts: DeploymentResponseGenerator, event_stream: bool) -> AsyncIterator[bytes]:
    """The rest of a replica's answer; a replica lost mid-stream ends an event stream with an
    error event (other bodies are cut short, which the client sees as a broken response)."""
    finished = False
    try:
        async for chunk in parts:
            yield chunk
        finished = True
    except RayActorError as error:
        finished = True
        if not event_stream:
            raise
        log.warning("a replica died mid-stream: %s", error)
        lost = error_body(f"the replica serving this stream died: {error}", kind="server_error")
        yield f"data: {json.dumps(lost)}\n\ndata: [DONE]\n\n".encode()
    finally:
        if not finished:  # the client left: stop the replica's work for it
            parts.cancel()


def _is_event_stream(start: ResponseStart) -> bool:
    return any(
        key.lower() == b"content-type" and value.startswith(b"text/event-stream")
        for key, value in start.headers
    )


def _error(status: int, message: str) -> JSONResponse:
    return JSONResponse(error_body(message, kind="server_error"), status_code=status)


# Last in the module: `serve.ingress` freezes the app (a cloudpickle round trip) as it decorates
# the class, and the routes' functions keep only the module names defined by then.
front = FastAPI(title="jmamba (Ray Serve)")


@serve.ingress(front)
class Ingress:
    """The deployment's HTTP front (see the module docstring)."""

    def __init__(self, replicas: DeploymentHandle) -> None:
        self.replicas = replicas.options(stream=True)

    @front.api_route("/{path:path}", methods=METHODS)
    async def forward(self, request: Request) -> Response:
        """Hand `request` to a replica; its answer, streamed as it comes."""
        forwarded = await _forwarded(request)
        call = self.replicas.forward
        called = call.remote(forwarded) if forwarded.prompt else call.remote(request=forwarded)
        parts = cast(DeploymentResponseGenerator, called)  # a stream=True handle's answer
        try:
            start = await parts.__anext__()
        except RayActorError as error:
            log.warning("the replica serving %s died before it answered: %s", forwarded.path, error)
            return _error(503, f"the replica serving this request died, retry: {error}")
        except StopAsyncIteration:
            return _error(502, "the replica ended the call without an answer")
        except Exception as error:  # the replica's code failed: say so in OpenAI's shape
            log.exception("the replica failed %s", forwarded.path)
            return _error(500, f"the replica failed: {error}")
        assert isinstance(start, ResponseStart), start
        response = StreamingResponse(
            _body(parts, _is_event_stream(start)), status_code=start.status
        )
        response.raw_headers = [(k, v) for k, v in start.headers if k.lower() not in _HOP_BY_HOP]
        return response
