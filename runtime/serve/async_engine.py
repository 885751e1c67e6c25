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

`add` is the server's one entry: the engine thread adds a request's choices with
`Engine.add_request`, whose checks are the only ones a request meets (all or none: a choice it
refuses takes back the ones added before it), and the handler awaits the answer. Compiles are
timed as wall time: the start-up work's, then each step's that compiled a variant on first use
(logged: every request in flight waited for it).
"""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import logging
import queue
import threading
import time
from collections.abc import AsyncGenerator, Callable, Sequence
from typing import Protocol

from runtime.core.sampling_params import SamplingParams
from runtime.observe.snapshot import EngineSnapshot
from runtime.outputs.request_output import StreamDelta
from runtime.serve.errors import ApiError, BadRequest, named_param

log = logging.getLogger(__name__)

IDLE_WAIT_SECONDS = 0.5  # the thread's sleep between inbox checks when nothing runs
STOP_SECONDS = 3.0  # how long `stop` waits for the thread (a compile cannot be interrupted)

Job = tuple[Sequence[int], SamplingParams]  # one choice: prompt token ids, sampling params


class ServedEngine(Protocol):
    """What the engine thread drives: an `Engine` in this process, or the `RankGroup` in front
    of a process per data-parallel rank (`runtime.ranks`)."""

    def add_request(
        self,
        prompt_token_ids: Sequence[int],
        sampling_params: SamplingParams | None = None,
        request_id: str | int | None = None,
    ) -> str: ...

    def abort(self, request_id: str | int) -> object:
        """Something true when it stopped a live request."""
        ...

    @property
    def has_unfinished(self) -> bool: ...

    def step_deltas(self) -> list[StreamDelta]: ...

    @property
    def total_compile_seconds(self) -> float: ...

    @property
    def num_variants(self) -> int: ...

    def snapshot(self) -> EngineSnapshot: ...


class EngineError(ApiError, RuntimeError):
    """The engine failed a request after it was accepted (an internal error, not bad input)."""

    status = 500


@dataclasses.dataclass(frozen=True)
class _Add:
    request_id: str
    prompt: list[int]
    params: SamplingParams


@dataclasses.dataclass(frozen=True)
class _AddAll:
    """Choices to add all or none; `answer` gets None or the ValueError of the refused one."""

    request_ids: list[str]
    jobs: list[Job]
    answer: Callable[[ValueError | None], None]


@dataclasses.dataclass(frozen=True)
class _Abort:
    request_id: str


class AsyncEngine:
    """The engine thread and the per-request queues (see the module docstring).

    Attributes:
      engine: the `ServedEngine` (touch it only from the engine thread, or read its
        `snapshot`).
      ready: set once the start-up work (compiling the step variants) is done: until then the
        server answers 503.
      step_seconds: wall time of the latest engine step (for metrics).
      compile_seconds: wall time spent compiling: the start-up work, then the steps that
        compiled a variant on first use.
      num_late_compiles: steps after `ready` that compiled a variant.
      num_aborted: requests aborted before they finished (clients that left).
      failure: the exception of the start-up or step that retired the engine, or None.
    """

    def __init__(self, engine: ServedEngine) -> None:
        self.engine = engine
        self.step_seconds = 0.0
        self.compile_seconds = 0.0
        self.num_late_compiles = 0
        self.num_aborted = 0
        self.failure: Exception | None = None
        self.ready = threading.Event()
        self._startup: Callable[[], None] | None = None
        self._inbox: queue.SimpleQueue[_Add | _AddAll | _Abort] = queue.SimpleQueue()
        self._wake = threading.Event()
        self._streams: dict[str, asyncio.Queue[StreamDelta | EngineError]] = {}
        self._answers: set[asyncio.Future[ValueError | None]] = set()  # `add`s not yet answered
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
            self._thread.join(timeout=STOP_SECONDS)

    @property
    def num_live(self) -> int:
        """Requests queued to the thread or in the engine, not yet finished and read."""
        return len(self._streams)

    async def add(self, jobs: list[Job]) -> list[AsyncGenerator[StreamDelta]]:
        """Add every job (one choice each) through `Engine.add_request` on the engine thread,
        all or none; returns their delta streams (as `submit`'s). Raises `BadRequest` naming
        what the engine refused, `EngineError` once a failure has retired the engine."""
        self._check_serving()
        assert self._loop is not None, "start() first"
        request_ids = [f"req-{next(self._ids)}" for _ in jobs]
        streams = [self._open(request_id) for request_id in request_ids]
        answer: asyncio.Future[ValueError | None] = self._loop.create_future()
        self._answers.add(answer)
        loop = self._loop

        def reply(error: ValueError | None) -> None:  # on the engine thread
            loop.call_soon_threadsafe(_settle, answer, error)

        self._inbox.put(_AddAll(request_ids, jobs, reply))
        self._wake.set()
        try:
            refused = await answer
        except BaseException:  # the handler left, or the engine failed: take them back
            for request_id in request_ids:
                self.abort(request_id)
            raise
        finally:
            self._answers.discard(answer)
        if refused is not None:  # the engine holds none of them
            for request_id in request_ids:
                self._streams.pop(request_id, None)
            param = getattr(refused, "param", None) or named_param(str(refused))
            raise BadRequest(str(refused), param)
        return [self._deltas(i, s) for i, s in zip(request_ids, streams, strict=True)]

    def submit(
        self, prompt: list[int], params: SamplingParams
    ) -> tuple[str, AsyncGenerator[StreamDelta]]:
        """Queue a request whose prompt and params `Engine.check_request` accepted; returns its
        id and an async generator of its deltas (ending with the delta that finishes it; closing
        it aborts the request).
        Raises `EngineError` once a failed step has retired the engine."""
        self._check_serving()
        request_id = f"req-{next(self._ids)}"
        stream = self._open(request_id)
        self._inbox.put(_Add(request_id, prompt, params))
        self._wake.set()
        return request_id, self._deltas(request_id, stream)

    def _check_serving(self) -> None:
        if self.failure is not None:
            raise EngineError(f"the engine failed and serves no more (restart it): {self.failure}")

    def _open(self, request_id: str) -> asyncio.Queue[StreamDelta | EngineError]:
        """The queue of a new request's deltas."""
        stream: asyncio.Queue[StreamDelta | EngineError] = asyncio.Queue()
        self._streams[request_id] = stream
        if self.failure is not None:  # it failed after the check: no thread will answer
            stream.put_nowait(EngineError(f"engine step failed: {self.failure}"))
        return stream

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
        if not self._start_up():
            return
        self.ready.set()
        while not self._stopping:
            self._drain_inbox()
            if not self.engine.has_unfinished:
                self._wake.wait(IDLE_WAIT_SECONDS)
                self._wake.clear()
                continue
            start, compiled = time.perf_counter(), self._compiled_seconds()
            try:
                deltas = self.engine.step_deltas()
            except Exception as error:  # fail its requests, say why, take no more
                log.exception("engine step failed")
                self.failure = error
                self._fail_all(error)
                return
            self.step_seconds = time.perf_counter() - start
            self._count_late_compile(self._compiled_seconds() - compiled)
            if deltas and self._loop is not None:  # one wake-up of the loop per step
                self._loop.call_soon_threadsafe(self._deliver, deltas)

    def _start_up(self) -> bool:
        """Run the start-up work (timed as compile wall time); False if it failed."""
        start = time.perf_counter()
        try:
            if self._startup is not None:
                self._startup()
        except Exception as error:  # a compile failed: the server cannot serve
            log.exception("the server's start-up failed")
            self.failure = error
            return False
        self.compile_seconds = time.perf_counter() - start
        return True

    def _compiled_seconds(self) -> float:
        """Compile seconds summed over variants (the target's and the draft model's)."""
        return self.engine.total_compile_seconds

    def _count_late_compile(self, seconds: float) -> None:
        """A step after start-up compiled (serially, in the step: its seconds are wall time)."""
        if seconds <= 0:
            return
        self.compile_seconds += seconds
        self.num_late_compiles += 1
        log.warning(
            "a step compiled a new variant on first use in %.1f s (%d compiled; every request "
            "in flight waited): --warmup all compiles every variant before ready",
            seconds,
            self.engine.num_variants,
        )

    def _drain_inbox(self) -> None:
        while True:
            try:
                message = self._inbox.get_nowait()
            except queue.Empty:
                return
            if isinstance(message, _Abort):
                if self.engine.abort(message.request_id):
                    self.num_aborted += 1
                continue
            if isinstance(message, _AddAll):
                message.answer(self._add_all(message))
                continue
            try:
                self.engine.add_request(message.prompt, message.params, message.request_id)
            except ValueError as error:
                self._hand_over(message.request_id, EngineError(str(error)))

    def _add_all(self, message: _AddAll) -> ValueError | None:
        """Add a request's choices; at the first refused, take back those added before it."""
        added: list[str] = []
        for request_id, (prompt, params) in zip(message.request_ids, message.jobs, strict=True):
            try:
                self.engine.add_request(prompt, params, request_id)
            except ValueError as error:
                for done in added:
                    self.engine.abort(done)
                return error
            added.append(request_id)
        return None

    def _fail_all(self, error: Exception) -> None:
        """After a failed step: fail every live request's stream (and any queued one's), on the
        event loop, which owns the streams."""
        if self._loop is not None:
            self._loop.call_soon_threadsafe(self._fail_streams, f"engine step failed: {error}")

    def _fail_streams(self, message: str) -> None:
        for stream in self._streams.values():
            stream.put_nowait(EngineError(message))
        for answer in self._answers:  # the thread will not drain its inbox again
            if not answer.done():
                answer.set_exception(EngineError(message))

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


def _settle(answer: asyncio.Future[ValueError | None], error: ValueError | None) -> None:
    """On the event loop: the engine thread's answer to an `add`, unless its handler left."""
    if not answer.done():
        answer.set_result(error)
