"""`--api-key` (or `$JMAMBA_API_KEY`): every `/v1/*` route needs `Authorization: Bearer <key>`
(a 401 in OpenAI's shape otherwise); `/health` and `/metrics` stay open, for probes and
scrapers, as vLLM's do. The key is compared in constant time and never logged or echoed.
"""

from __future__ import annotations

import hmac

from starlette.datastructures import Headers
from starlette.types import ASGIApp, Receive, Scope, Send

from runtime.serve.errors import error_response


class ApiKey:
    """ASGI middleware: refuses a `/v1` request without the key (401)."""

    def __init__(self, app: ASGIApp, key: str) -> None:
        if not key:
            raise ValueError("the API key is empty")
        self.app = app
        self._key = key.encode()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and _guarded(scope["path"]) and not self._allowed(scope):
            response = error_response(
                401,
                "missing or wrong API key: send the header 'Authorization: Bearer <key>'",
                code="invalid_api_key",
                headers={"WWW-Authenticate": "Bearer"},
            )
            await response(scope, receive, send)
            return
        await self.app(scope, receive, send)

    def _allowed(self, scope: Scope) -> bool:
        scheme, _, token = Headers(scope=scope).get("authorization", "").partition(" ")
        # compare_digest on bytes: its time does not depend on where the two first differ
        return scheme.lower() == "bearer" and hmac.compare_digest(token.strip().encode(), self._key)


def _guarded(path: str) -> bool:
    return path == "/v1" or path.startswith("/v1/")
