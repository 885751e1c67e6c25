"""`JmambaReplica`: one Ray Serve replica, a whole `jmamba serve` (model, engine thread, FastAPI
app) in its actor process.

The constructor builds the app from the factory it is given (the command's own options, so a
replica is exactly the server `jmamba serve` would start), starts it as its lifespan would (the
model loads in its thread, the engine thread compiles the warm-up variants) and returns once the
app is ready: Ray Serve routes to a replica only after its constructor returned, so no request meets
a replica that is still compiling. A load or warm-up that fails raises, and Serve starts another.

`forward` answers one `ForwardedRequest` through the app (`exchange.py`) as a stream of parts,
the response's start naming this replica (`REPLICA_HEADER`: Serve's full replica id, which is
also its actor's name in the "serve" namespace). `check_health`, which Serve calls every
`health_check_period_s`, fails once a step failure has retired the engine (the app's `/health`
says 503 then), so Serve replaces the replica.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable

from fastapi import FastAPI
from ray import serve

from runtime.ray_serve.exchange import exchange
from runtime.ray_serve.forwarded import ForwardedRequest, ResponseStart

REPLICA_HEADER = b"x-jmamba-replica"
READY_POLL_SECONDS = 0.05


class JmambaReplica:
    """A jmamba server inside a Ray Serve replica (see the module docstring)."""

    async def __init__(self, app_factory: Callable[[], FastAPI]) -> None:  # type: ignore[misc]
        """Build the app, start it and wait until it serves (raises if it cannot)."""
        self.app = app_factory()
        self.replica_id = serve.get_replica_context().replica_id.to_full_id_str()
        # What the app's lifespan does when a server starts it (its end is `__del__`).
        self.app.state.startup.begin(asyncio.get_running_loop())
        await self._until_ready()

    async def _until_ready(self) -> None:
        startup = self.app.state.startup
        while startup.stage not in ("ready", "failed"):
            await asyncio.sleep(READY_POLL_SECONDS)
        if startup.failure is not None:
            raise RuntimeError(f"the replica could not start: {startup.failure}") from (
                startup.failure
            )

    async def forward(self, request: ForwardedRequest) -> AsyncIterator[ResponseStart | bytes]:
        """`request` through the app: a `ResponseStart` (with `REPLICA_HEADER`), then chunks."""
        async for part in exchange(self.app, request):
            if isinstance(part, ResponseStart):
                header = (REPLICA_HEADER, self.replica_id.encode())
                part = ResponseStart(part.status, [*part.headers, header])
            yield part

    def check_health(self) -> None:
        """Raise once the engine has failed (Serve then replaces this replica)."""
        failure = self.app.state.startup.failure
        if failure is not None:
            raise RuntimeError(f"the engine failed and serves no more: {failure}")

    def __del__(self) -> None:
        """Serve's graceful shutdown (once the requests in flight drained): stop the engine
        thread and the front door's workers, as the app's lifespan does when it ends."""
        app = getattr(self, "app", None)  # None when the constructor failed early
        if app is not None:
            app.state.startup.stop()
