"""`RankGroup`: the front process's face of the rank processes, shaped like the `Engine` that
`LLM` and the server's engine thread drive (`add_request`, `abort`, `step`, `step_deltas`,
`stream`, `has_unfinished`).

The front checks each request with the engine's own checks (`RequestTable`, from the config the
ranks resolved), names and seeds it as one engine would (arrival number, engine seed * stride +
arrival number: so sampled outputs equal one engine's too), places it on the rank with the least
outstanding tokens, and sends it there. A step here reads what the ranks have sent since: their
finished outputs or stream deltas. A rank process that fails or dies fails the group: every
later call raises `RankFailure` naming the rank and how it ended, and the other ranks are
stopped, so nothing waits on a rank that will never answer.
"""

from __future__ import annotations

import dataclasses
import subprocess
import weakref
from collections.abc import Iterator, Sequence
from multiprocessing.connection import wait
from typing import Any, Literal

from runtime.core.config import COMPILE_WORKERS, EngineConfig
from runtime.core.kv_events_config import KVEventsConfig
from runtime.core.request_table import RequestTable
from runtime.core.sampling_params import SamplingParams
from runtime.observe.snapshot import EngineSnapshot
from runtime.observe.step_stats import StepStats
from runtime.outputs.request_output import RequestOutput, StreamDelta
from runtime.ranks.launch import RankProcess, RankSpec, start_rank
from runtime.ranks.messages import (
    Abort,
    Add,
    Failed,
    RankInfo,
    RankMessage,
    Ready,
    Refused,
    Snapshot,
    StatsReply,
    StatsRequest,
    Stepped,
    Stop,
    Streaming,
    WarmedUp,
    Warmup,
)

WAIT_SECONDS = 0.005  # longest a step waits for a rank's message (then the caller's loop runs)
STOP_SECONDS = 10.0  # how long `close` waits for a rank process to exit before killing it


class RankFailure(RuntimeError):
    """A rank process failed or died: the group serves no more."""


class RankGroup:
    """D rank processes serving as one engine (module docstring).

    Attributes:
      config / model_config: the engine config every rank resolved, and the model's.
      info: rank 0's `RankInfo` (parameter count, dtype, programs compiled at start-up).
      ranks: the rank indices, 0 .. D - 1.
      failure: the `RankFailure` that stopped the group, or None.
    """

    def __init__(self, processes: list[RankProcess], info: RankInfo) -> None:
        self._processes = processes
        self.info = info
        self.config: EngineConfig = info.config
        self.model_config = info.model_config
        self.ranks = tuple(p.rank for p in processes)
        self.requests = RequestTable.of(self.config, self.model_config)
        self.failure: RankFailure | None = None
        self._streaming = False
        self._refused: list[ValueError] = []
        self._stats: dict[int, StepStats] = {}
        self._pending: list[RequestOutput | StreamDelta] = []  # read while waiting for stats
        self._snapshots = {p.rank: info.snapshot for p in processes}  # the latest of each rank
        self._warmed: set[int] = set()
        self._finalizer = weakref.finalize(self, _stop_all, processes)

    @classmethod
    def start(
        cls,
        model: str,
        *,
        num_ranks: int,
        dtype: str,
        warmup: bool | str,
        options: dict[str, Any],
    ) -> RankGroup:
        """Start `num_ranks` processes, each loading `model` as a one-rank `LLM` with `options`
        (all load at once); returns when every one is ready. RankFailure if one fails."""
        per_rank = int(options.get("tensor_parallel_size", 1))
        one_rank = dict(options, data_parallel_size=1)
        specs = [
            RankSpec(r, model, dtype, warmup, _rank_options(one_rank, r)) for r in range(num_ranks)
        ]
        processes: list[RankProcess] = []
        try:
            processes += [start_rank(spec, per_rank) for spec in specs]
            infos = [_await_ready(p) for p in processes]
        except BaseException:
            _stop_all(processes)
            raise
        return cls(processes, infos[0])

    # --------------------------------------------------------------------------------- requests

    def check_request(
        self, prompt_token_ids: Sequence[int], sampling_params: SamplingParams | None = None
    ) -> tuple[list[int], SamplingParams]:
        """As `Engine.check_request` (the same checks, from the ranks' config)."""
        return self.requests.check(prompt_token_ids, sampling_params)

    def add_request(
        self,
        prompt_token_ids: Sequence[int],
        sampling_params: SamplingParams | None = None,
        request_id: str | int | None = None,
    ) -> str:
        """Check, name, seed and place a request, and send it to its rank; returns its id."""
        self._check_serving()
        prompt, params = self.check_request(prompt_token_ids, sampling_params)
        request = self.requests.new(prompt, params, request_id)
        rank = self._least_outstanding()
        self.requests.add(request, rank)
        seeded = dataclasses.replace(params, seed=request.seed)
        self._send(rank, Add([request.request_id], [prompt], [seeded]))
        return request.request_id

    def abort(self, request_id: str | int) -> bool:
        """Stop a request on its rank (which frees its blocks and slot); False if it is unknown
        or finished."""
        rank = self.requests.local_rank(str(request_id))
        if rank is None:
            return False
        self.requests.remove(str(request_id))
        self._send(rank, Abort(str(request_id)))
        return True

    @property
    def has_unfinished(self) -> bool:
        return len(self.requests) > 0

    def any_unfinished(self) -> bool:
        return self.has_unfinished

    def _least_outstanding(self) -> int:
        """The rank with the fewest tokens still to compute for its requests (lowest on ties),
        counted from what the front sent (as `runtime.router.LeastOutstandingWork` counts)."""
        loads = [0] * len(self.ranks)
        for request in self.requests.live():
            loads[self.requests.rank_of(request.request_id)] += request.num_tokens_left
        return loads.index(min(loads))

    # --------------------------------------------------------------------------------- outputs

    def step(self) -> list[RequestOutput]:
        """What the ranks finished since the last call (waiting up to WAIT_SECONDS for some)."""
        self._stream(False)
        items = self._take_pending() + self._read()
        return [_output(o) for o in items if _finished(o)]

    def step_deltas(self) -> list[StreamDelta]:
        """The stream deltas the ranks sent since the last call (as `Engine.step_deltas`)."""
        self._stream(True)
        items = self._take_pending() + self._read()
        return [o if isinstance(o, StreamDelta) else _final_delta(o) for o in items]

    def stream(self) -> Iterator[StreamDelta]:
        while self.has_unfinished:
            yield from self.step_deltas()

    @property
    def stats(self) -> StepStats:
        """Every rank's counters (a round trip to each rank; `StepStats.of_processes`)."""
        for rank in self.ranks:
            self._send(rank, StatsRequest())
        self._stats.clear()
        while len(self._stats) < len(self.ranks):
            self._pending += self._read()  # outputs that come meanwhile wait for the next step
        return StepStats.of_processes([self._stats[r] for r in self.ranks])

    @property
    def num_variants(self) -> int:
        """Step programs of the rank with the most (as its latest snapshot says)."""
        return self.snapshot().num_variants

    def snapshot(self) -> EngineSnapshot:
        """The ranks' latest snapshots as one (`EngineSnapshot.total`; safe from any thread)."""
        return EngineSnapshot.total(list(self._snapshots.values()))

    @property
    def total_compile_seconds(self) -> float:
        """Seconds compiling, as far as the ranks' latest snapshots say (the slowest rank's)."""
        return self.snapshot().compile_seconds

    def warmup(
        self,
        *,
        prefill: bool | Literal["alone"] = False,
        sampled: bool = False,
        progress: bool = False,
        workers: int = COMPILE_WORKERS,
    ) -> None:
        """`Engine.warmup` on every rank at once; returns when all are done. Their progress is
        in `snapshot().warmup` meanwhile (`progress` bars are each rank's own)."""
        self._warmed.clear()
        for rank in self.ranks:
            self._send(rank, Warmup(prefill, sampled, workers))
        while len(self._warmed) < len(self.ranks):
            self._pending += self._read()

    def _take_pending(self) -> list[RequestOutput | StreamDelta]:
        items, self._pending = self._pending, []
        return items

    def _read(self) -> list[RequestOutput | StreamDelta]:
        """What the ranks have sent since the last read (waiting a little for the first)."""
        self._check_serving()
        items: list[RequestOutput | StreamDelta] = []
        ready = set(wait([p.conn for p in self._processes], WAIT_SECONDS))
        for process in self._processes:
            if process.conn in ready:
                items += self._drain(process)
        if self._refused:
            error, self._refused = self._refused[0], []
            raise error
        return items

    def _drain(self, process: RankProcess) -> list[RequestOutput | StreamDelta]:
        """Every message waiting on a rank's connection; the group fails if the rank has gone."""
        items: list[RequestOutput | StreamDelta] = []
        try:
            while process.conn.poll(0):
                items += self._take(process, process.conn.recv())
        except (EOFError, OSError):
            self._fail(process, "")
        return items

    def _take(self, process: RankProcess, message: RankMessage) -> list:
        if isinstance(message, Stepped):
            finished = [o.request_id for o in message.items if _finished(o)]
            for request_id in finished:
                if self.requests.local_rank(request_id) is not None:
                    self.requests.remove(request_id)
            return list(message.items)
        if isinstance(message, Refused):
            self.requests.remove(message.request_id)
            self._refused.append(message.error)
        elif isinstance(message, StatsReply):
            self._stats[process.rank] = message.stats
        elif isinstance(message, Snapshot):
            self._snapshots[process.rank] = message.snapshot
        elif isinstance(message, WarmedUp):
            self._snapshots[process.rank] = message.snapshot
            self._warmed.add(process.rank)
        elif isinstance(message, Failed):
            self._fail(process, message.message)
        return []

    # --------------------------------------------------------------------------------- control

    def _stream(self, on: bool) -> None:
        if on != self._streaming:
            self._streaming = on
            for rank in self.ranks:
                self._send(rank, Streaming(on))

    def _send(self, rank: int, message: Any) -> None:
        self._check_serving()
        process = self._processes[rank]
        try:
            process.conn.send(message)
        except OSError:
            self._fail(process, "")

    def _check_serving(self) -> None:
        if self.failure is not None:
            raise self.failure

    def _fail(self, process: RankProcess, message: str) -> None:
        try:
            process.process.wait(timeout=STOP_SECONDS)  # a process that failed is ending
        except subprocess.TimeoutExpired:
            pass
        detail = message or f"it ended ({process.describe_exit()})"
        self.failure = RankFailure(
            f"data-parallel rank {process.rank}'s process failed: {detail}; "
            f"{len(self.requests)} requests in flight were lost"
        )
        self.close()
        raise self.failure

    def close(self) -> None:
        """Stop every rank process (each finishes its step first); idempotent."""
        self._finalizer()


def _await_ready(process: RankProcess) -> RankInfo:
    """The rank's `RankInfo` once it has loaded; RankFailure if it failed or died loading."""
    try:
        message = process.conn.recv()
    except (EOFError, OSError):
        process.process.wait()
        message = Failed(f"rank {process.rank}: it ended loading ({process.describe_exit()})")
    if isinstance(message, Ready):
        return message.info
    assert isinstance(message, Failed), message
    raise RankFailure(f"data-parallel rank process failed to start: {message.message}")


def _rank_options(options: dict[str, Any], rank: int) -> dict[str, Any]:
    """A rank process's `LLM` options: its cache events name it as data-parallel rank `rank`
    (and so publish on the endpoint's port + rank), as one engine's rank `rank` would."""
    events = KVEventsConfig.of(options.get("kv_events_config"))
    if events is None:
        return options
    return dict(options, kv_events_config=events.for_rank(rank))


def _stop_all(processes: list[RankProcess]) -> None:
    for process in processes:
        try:
            process.conn.send(Stop())
        except OSError:
            pass
    for process in processes:
        try:
            process.process.wait(timeout=STOP_SECONDS)
        except subprocess.TimeoutExpired:  # it did not stop in time: end it
            process.process.kill()
            process.process.wait()
        process.conn.close()


def _finished(item: RequestOutput | StreamDelta) -> bool:
    return not isinstance(item, StreamDelta) or item.finished


def _output(item: RequestOutput | StreamDelta) -> RequestOutput:
    """A finished request's output, from its output or its last delta."""
    if isinstance(item, RequestOutput):
        return item
    assert item.output is not None, "a finished request's last delta carries its output"
    return item.output


def _final_delta(output: RequestOutput) -> StreamDelta:
    """The closing delta of a request that finished while outputs were not streamed."""
    return StreamDelta(output.request_id, [], None, None, finished=True, output=output)
