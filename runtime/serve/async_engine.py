"""`AsyncEngine`: one engine thread under an asyncio server.

The engine is not thread-safe and its step blocks on the device, so exactly one thread owns it.
Handlers (asyncio, any number) talk to that thread through an inbox: `submit` queues a checked
request and returns an asyncio queue that receives the request's `StreamDelta`s as the engine
produces them (its last one carries the `RequestOutput`); `abort` queues an abort (a client that
disconnects). The thread drains the inbox, steps while any request is unfinished, hands each
step's deltas to their queues on the event loop (one wake-up of the loop per step, not per
request), and sleeps on an event when idle.

A request that the engine refuses when the thread adds it (it is checked before it is queued, so
this means a bug) gets an `EngineError` in its queue. An exception inside a step (a bug, or the
device out of memory) fails every live request the same way and retires the engine for good
(`failure`): the step may have consumed the donated caches, so no later step could be trusted.
The server then answers `/health` 503 with the cause and refuses new requests, so that whatever
supervises it restarts it (vLLM's engine does the same on a dead engine), instead of streaming
empty answers from a broken one.
"""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import logging
import queue
import threading
import time
from collections.abc import AsyncGenerator, Callable

from runtime.core.sampling_params import SamplingParams
from runtime.engine import Engine
from runtime.outputs.request_output import StreamDelta

log = logging.getLogger(__name__)

IDLE_WAIT_SECONDS = 0.5  # the thread's sleep between inbox checks when nothing runs


class EngineError(RuntimeError):
    """The engine failed a request after it was accepted (an internal error, not bad input)."""


@dataclasses.dataclass(frozen=True)
class _Add:
    request_id: str
    prompt: list[int]
    params: SamplingParams


@dataclasses.dataclass(frozen=True)
class _Abort:
    request_id: str


class AsyncEngine:
    """The engine thread and the per-request queues (see the module docstring).

    Attributes:
      engine: the `Engine` (touch it only from the engine thread, or read plain counters).
      ready: set once the start-up work (compiling the step variants) is done: until then the
        server answers 503.
      step_seconds: wall time of the latest engine step (for metrics).
      failure: the exception of the step that retired the engine, or None while it serves.
    """

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self.step_seconds = 0.0
        self.failure: Exception | None = None
        self.ready = threading.Event()
        self._startup: Callable[[], None] | None = None
        self._inbox: queue.SimpleQueue[_Add | _Abort] = queue.SimpleQueue()
        self._wake = threading.Event()
        self._streams: dict[str, asyncio.Queue[StreamDelta | EngineError]] = {}
        self._ids = itertools.count()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._stopping = False

    def start(
        self, loop: asyncio.AbstractEventLoop, startup: Callable[[], None] | None = None
    ) -> None:
        """Start the engine thread: it runs `startup` (e.g. compiling the step variants), sets
        `ready`, then serves; deltas are handed to `loop`."""
        self._loop, self._startup = loop, startup
        self._thread = threading.Thread(target=self._run, name="jmamba-engine", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop the engine thread (after its current step)."""
        self._stopping = True
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout=30)

    def submit(
        self, prompt: list[int], params: SamplingParams
    ) -> tuple[str, AsyncGenerator[StreamDelta]]:
        """Queue a request whose prompt and params `Engine.check_request` accepted; returns its
        id and an async generator of its deltas (ending with the delta that finishes it; closing
        it aborts the request).
        Raises `EngineError` once a failed step has retired the engine."""
        if self.failure is not None:
            raise EngineError(f"the engine failed and serves no more (restart it): {self.failure}")
        request_id = f"req-{next(self._ids)}"
        stream: asyncio.Queue[StreamDelta | EngineError] = asyncio.Queue()
        self._streams[request_id] = stream
        if self.failure is not None:  # it failed after the check above: no thread will answer
            stream.put_nowait(EngineError(f"engine step failed: {self.failure}"))
        self._inbox.put(_Add(request_id, prompt, params))
        self._wake.set()
        return request_id, self._deltas(request_id, stream)

    def abort(self, request_id: str) -> None:
        """Stop a request (its blocks and slots are freed by the engine thread)."""
        if self._streams.pop(request_id, None) is not None:
            self._inbox.put(_Abort(request_id))
            self._wake.set()

    async def _deltas(
        self, request_id: str, stream: asyncio.Queue[StreamDelta | EngineError]
    ) -> AsyncGenerator[StreamDelta]:
        try:
            while True:
                delta = await stream.get()
                if isinstance(delta, EngineError):
                    raise delta
                yield delta
                if delta.finished:
                    return
        finally:
            self.abort(request_id)  # a no-op once finished; frees it when the client left

    # ------------------------------------------------------------------------ engine thread

    def _run(self) -> None:
        if self._startup is not None:
            self._startup()
        self.ready.set()
        while not self._stopping:
            self._drain_inbox()
            if not self.engine.has_unfinished:
                self._wake.wait(IDLE_WAIT_SECONDS)
                self._wake.clear()
                continue
            start = time.perf_counter()
            try:
                deltas = self.engine.step_deltas()
            except Exception as error:  # fail its requests, say why, take no more
                log.exception("engine step failed")
                self.failure = error
                self._fail_all(error)
                return
            self.step_seconds = time.perf_counter() - start
            if deltas and self._loop is not None:  # one wake-up of the loop per step
                self._loop.call_soon_threadsafe(self._deliver, deltas)

    def _drain_inbox(self) -> None:
        while True:
            try:
                message = self._inbox.get_nowait()
            except queue.Empty:
                return
            if isinstance(message, _Abort):
                self.engine.abort(message.request_id)
                continue
            try:
                self.engine.add_request(message.prompt, message.params, message.request_id)
            except ValueError as error:
                self._hand_over(message.request_id, EngineError(str(error)))

    def _fail_all(self, error: Exception) -> None:
        """After a failed step: fail every live request's stream (and any queued one's), on the
        event loop, which owns the streams."""
        if self._loop is not None:
            self._loop.call_soon_threadsafe(self._fail_streams, f"engine step failed: {error}")

    def _fail_streams(self, message: str) -> None:
        for stream in self._streams.values():
            stream.put_nowait(EngineError(message))

    def _deliver(self, deltas: list[StreamDelta]) -> None:
        """On the event loop: one step's deltas into their requests' queues."""
        for delta in deltas:
            stream = self._streams.get(delta.request_id)
            if stream is not None:
                stream.put_nowait(delta)

    def _hand_over(self, request_id: str, item: StreamDelta | EngineError) -> None:
        stream = self._streams.get(request_id)
        if stream is not None and self._loop is not None:
            self._loop.call_soon_threadsafe(stream.put_nowait, item)
