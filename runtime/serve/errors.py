"""Every error the server answers, in OpenAI's shape: `{"error": {"message", "type", "param",
"code"}}` with the status that fits, from every route and every failure: a body that does not
validate (400), an unknown route (404), a wrong method (405), a body that is not UTF-8 or not
JSON (400), a body over the size limit (413), a missing or wrong API key (401), an overloaded or
starting server (503 with `Retry-After`), an engine failure or a bug (500).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException

# OpenAI's `type` of an error by status (its API answers these; 5xx are the server's fault).
_KINDS = {
    401: "authentication_error",
    404: "not_found_error",
    413: "invalid_request_error",
    429: "rate_limit_error",
    503: "server_overloaded",
}


def error_body(
    message: str,
    param: str | None = None,
    kind: str = "invalid_request_error",
    code: str | None = None,
) -> dict[str, Any]:
    """An OpenAI-style error object."""
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}


def error_response(
    status: int,
    message: str,
    param: str | None = None,
    code: str | None = None,
    headers: Mapping[str, str] | None = None,
) -> JSONResponse:
    """A JSON error response of `status`, its `type` the one OpenAI gives that status."""
    kind = _KINDS.get(status, "server_error" if status >= 500 else "invalid_request_error")
    body = error_body(message, param, kind, code)
    return JSONResponse(body, status_code=status, headers=headers)


class ApiError(Exception):
    """A request the server answers with an error of `status` (and `headers`)."""

    status = 400

    def __init__(
        self,
        message: str,
        param: str | None = None,
        *,
        code: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.param, self.code, self.headers = param, code, headers

    def response(self) -> JSONResponse:
        return error_response(self.status, str(self), self.param, self.code, self.headers)


class BadRequest(ApiError, ValueError):
    """A request body the server refuses (400 naming `param`)."""


class Unavailable(ApiError):
    """The server cannot take the request now (starting, overloaded, stopping): 503, and
    `Retry-After` says when to come back."""

    status = 503

    def __init__(self, message: str, retry_after: int, code: str) -> None:
        super().__init__(message, code=code, headers={"Retry-After": str(retry_after)})


def named_param(message: str) -> str | None:
    """The field a `SamplingParams` / engine check names first ("max_tokens=-1 must ...")."""
    match = re.match(r"(\w+)=", message)
    return match.group(1) if match else None


def add_error_handlers(app: FastAPI) -> None:
    """Answer every exception a route raises in OpenAI's shape."""

    @app.exception_handler(RequestValidationError)
    async def invalid_body(request: Request, error: RequestValidationError) -> JSONResponse:
        return _validation_error(error)

    @app.exception_handler(HTTPException)
    async def http_error(request: Request, error: HTTPException) -> JSONResponse:
        # Starlette's own: an unknown route, a wrong method, a body it could not read.
        code = {404: "not_found", 405: "method_not_allowed"}.get(error.status_code)
        message = str(error.detail)
        if error.status_code == 404:
            message = f"no route {request.method} {request.url.path}"
        elif error.status_code == 405:
            message = f"{request.method} is not allowed on {request.url.path}"
        elif error.status_code == 400:
            message = "the request body is not valid UTF-8 JSON"
        return error_response(error.status_code, message, code=code, headers=error.headers)

    @app.exception_handler(ApiError)
    async def api_error(request: Request, error: ApiError) -> JSONResponse:
        return error.response()

    @app.exception_handler(ValueError)
    async def bad_value(request: Request, error: ValueError) -> JSONResponse:
        return error_response(400, str(error), named_param(str(error)))

    @app.exception_handler(Exception)
    async def failed(request: Request, error: Exception) -> JSONResponse:
        # A bug: said in OpenAI's shape (Starlette re-raises it after, so uvicorn logs it).
        return error_response(500, f"internal error: {type(error).__name__}: {error}")


def _validation_error(error: RequestValidationError) -> JSONResponse:
    """The first problem pydantic found, as an OpenAI error naming the field."""
    first = error.errors()[0] if error.errors() else {}
    if first.get("type") == "json_invalid":
        return error_response(400, "the request body is not valid JSON")
    location = [part for part in first.get("loc", ()) if part != "body"]
    param = str(location[0]) if location else None
    message = str(first.get("msg", error))
    return error_response(400, f"{param}: {message}" if param else message, param)
