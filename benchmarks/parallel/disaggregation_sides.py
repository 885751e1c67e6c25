"""The two processes of `benchmarks.parallel.disaggregation`: the prefill side (device 0: the
prefill engine, and the baseline, one engine doing both) and the decode side (device 1), each run
as `python -m benchmarks.parallel.disaggregation_sides CONTROL_FD LINK_FD` by the bench.

CONTROL_FD is a socket to the bench: it sends a `Spec`, this side answers when its engine is
built, then each command ("baseline", "pd") is answered with that run's record, until "stop"
(pickled: both ends are this code). LINK_FD is a socket between the two sides: the hand-overs'
`ConnectionTransport`, or where the NIXL agents exchange their metadata. Every time is
`time.monotonic()` (CLOCK_MONOTONIC on Linux: one clock for the host's processes), so an arrival
noted on the prefill side and a token noted on the decode side subtract.

Engines schedule synchronously (a prefill instance must; the baseline and the decode engine do
too, so the three steps compare). Each run gets fresh engines on its side's runner (its compiled
steps and caches), so the timed run's prefix cache starts as empty as the warm run's did.
"""

from __future__ import annotations

import dataclasses
import json
import sys
import time
from multiprocessing.connection import Connection
from typing import Any

import jax
import numpy as np

import jmamba
from benchmarks.harness.models import SIZES, build_model
from benchmarks.harness.serving import bench_config
from jmamba import HybridLM
from runtime.core.budgets import min_token_budget
from runtime.core.engine_args import EngineArgs
from runtime.core.sampling_params import SamplingParams
from runtime.device.memory import resolve_config
from runtime.device.model_runner import ModelRunner
from runtime.disagg import ConnectionTransport, DecodeInstance, Handover, PrefillInstance
from runtime.disagg.decode_instance import Arrivals
from runtime.disagg.pool_rows import PoolRows
from runtime.disagg.transport import Transport
from runtime.engine import Engine

PREFILL, DECODE = "prefill", "decode"


@dataclasses.dataclass(frozen=True)
class Spec:
    """What a side serves (the bench's flags of the same names), and which side it is."""

    role: str
    model: str
    requests: int
    prefix_len: int
    tail_len: int
    max_tokens: int
    rate: float  # requests per second; 0: all at once
    concurrency: int
    budget: int
    prefix_caching: str
    batch_invariant: bool
    transport: str
    lost_after_s: float  # a hand-over not arrived by then fails its request

    @property
    def label(self) -> str:
        """The weights' name in the hand-overs' fingerprint (both sides build the same)."""
        return f"benchmarks.parallel.disaggregation:{self.model}"

    @property
    def ids(self) -> list[str]:
        return [f"r{i}" for i in range(self.requests)]


def load(name: str) -> HybridLM:
    """A bench model's random weights (`benchmarks/harness/models.py`), else `jmamba.load_model`'s
    model of `name` (a preset such as tiny-nemotron_h, or a checkpoint directory)."""
    return build_model(name) if name in SIZES else jmamba.load_model(name)[0]


def engine_args(spec: Spec, chunk_size: int) -> EngineArgs:
    """Each engine's options: `concurrency` sequences, one decode bucket, one prefill bucket of
    `budget` tokens; the decode side caches no prefix (it never computes a prompt)."""
    length = 1 << (spec.prefix_len + spec.tail_len + spec.max_tokens).bit_length()
    return bench_config(
        spec.concurrency,
        max(spec.budget, min_token_budget(chunk_size, spec.concurrency)),
        length,
        (max(spec.concurrency, 2),),
        prefix_caching="off" if spec.role == DECODE else spec.prefix_caching,
        batch_invariant=spec.batch_invariant,
        async_scheduling=False,
    )


def prompts(spec: Spec, vocab: int) -> list[list[int]]:
    """`requests` prompts: one random prefix of `prefix_len` tokens, then a random tail each."""
    rng = np.random.default_rng(0)
    prefix = rng.integers(0, vocab, spec.prefix_len).tolist()
    return [prefix + rng.integers(0, vocab, spec.tail_len).tolist() for _ in range(spec.requests)]


def greedy(spec: Spec) -> SamplingParams:
    """Every request's params: greedy, `max_tokens` tokens, EOS ignored."""
    return SamplingParams(max_tokens=spec.max_tokens, ignore_eos=True)


class Schedule:
    """When each request arrives: request i at `start` + i / rate (all at `start` for rate 0)."""

    def __init__(self, count: int, rate: float) -> None:
        self.start = time.monotonic()
        self.offsets = [i / rate if rate > 0 else 0.0 for i in range(count)]
        self.next = 0
        self.arrivals: dict[str, float] = {}

    @property
    def pending(self) -> bool:
        return self.next < len(self.offsets)

    def due(self) -> list[int]:
        """The requests due by now and not yet taken (their arrival times noted)."""
        taken = []
        while self.pending and self.start + self.offsets[self.next] <= time.monotonic():
            self.arrivals[f"r{self.next}"] = self.start + self.offsets[self.next]
            taken.append(self.next)
            self.next += 1
        return taken

    def wait(self) -> None:
        """Sleep until the next request is due."""
        if self.pending:
            time.sleep(max(0.0, self.start + self.offsets[self.next] - time.monotonic()))


def wire_bytes(handover: Handover) -> int:
    """The bytes of `handover.to_bytes()`, counted without making them."""
    return 4 + len(json.dumps(handover.header()).encode()) + handover.nbytes


class TimedTransport:
    """A `Transport` noting, per request, its send's (start, end, wire bytes, row bytes) and when
    its receive returned."""

    def __init__(self, inner: Transport) -> None:
        self.inner = inner
        self.sent: dict[str, tuple[float, float, int, int]] = {}
        self.received: dict[str, float] = {}

    def send(self, handover: Handover) -> None:
        start = time.monotonic()
        self.inner.send(handover)
        end = time.monotonic()
        self.sent[handover.request_id] = (start, end, wire_bytes(handover), handover.nbytes)

    def receive(self, timeout: float) -> Handover | None:
        handover = self.inner.receive(timeout)
        if handover is not None:
            self.received[handover.request_id] = time.monotonic()
        return handover

    def close(self) -> None:
        self.inner.close()


class TimedPrefill(PrefillInstance):
    """A `PrefillInstance` noting each export's (start, end): its rows read to the host."""

    def __init__(self, engine: Engine, transport: Transport, rows: PoolRows | None, label: str):
        super().__init__(engine, transport, label=label)
        self.rows = rows or self.rows  # an earlier run's: its compiled reads
        self.exports: dict[str, tuple[float, float]] = {}

    def _export(self, request_id: str) -> Handover:
        start = time.monotonic()
        handover = super()._export(request_id)
        self.exports[request_id] = (start, time.monotonic())
        return handover


class TimedDecode(DecodeInstance):
    """A `DecodeInstance` noting each admission's (start, end), the end once its scatter is done
    on the device (the next step would wait for it anyway)."""

    def __init__(self, engine: Engine, transport: Transport, rows: PoolRows | None, label: str):
        super().__init__(engine, transport, label=label)
        self.rows = rows or self.rows  # an earlier run's: its compiled writes
        self.admits: dict[str, tuple[float, float]] = {}

    def _admit(self, handover: Handover, arrivals: Arrivals) -> bool:
        start = time.monotonic()
        admitted = super()._admit(handover, arrivals)
        if admitted:
            jax.block_until_ready(self.engine.runner.caches)
            self.admits[handover.request_id] = (start, time.monotonic())
        return admitted


def open_transport(spec: Spec, link: Connection) -> Transport:
    """This side's end of the link: the local connection, or a NIXL agent that has exchanged
    metadata with its peer's over it."""
    if spec.transport == "local":
        return ConnectionTransport(link)
    from runtime.disagg.nixl import NixlTransport

    peer = DECODE if spec.role == PREFILL else PREFILL
    transport = NixlTransport(spec.role, peer)
    link.send_bytes(transport.metadata())
    transport.add_peer(link.recv_bytes())
    return transport


class Seen:
    """Each request's output tokens and when this side first saw each (a step's tokens are seen
    when the step returns)."""

    def __init__(self) -> None:
        self.tokens: dict[str, list[int]] = {}
        self.times: dict[str, list[float]] = {}

    def note(self, request_id: str, tokens: list[int], at: float) -> None:
        """`tokens`: the request's output so far; those not seen before were seen at `at`."""
        new = tokens[len(self.tokens.get(request_id, [])) :]
        self.tokens.setdefault(request_id, []).extend(new)
        self.times.setdefault(request_id, []).extend([at] * len(new))

    def step(self, engine: Engine, live: set[str]) -> set[str]:
        """Step `engine` and note its `live` requests' tokens; returns the ids that finished
        (they leave `live`)."""
        finished = engine.step()
        at = time.monotonic()
        for output in finished:
            self.note(output.request_id, output.token_ids, at)
        live.difference_update(output.request_id for output in finished)
        for request_id in live:
            self.note(request_id, engine.request(request_id).output_token_ids, at)
        return {output.request_id for output in finished}

    def record(self) -> dict[str, Any]:
        return dict(tokens=self.tokens, times=self.times)


class Side:
    """One side's model, runner and link; `run(command)` serves the workload once."""

    def __init__(self, spec: Spec, link: Connection) -> None:
        begun = time.monotonic()
        self.spec = spec
        self.model = load(spec.model)
        self.args = engine_args(spec, self.model.config.chunk_size)
        self.runner = ModelRunner(self.model, resolve_config(self.model, self.args))
        if spec.role == DECODE:  # its decode steps compile while the baseline warms up
            Engine(self.model, self.args, runner=self.runner).warmup()
        self.transport = TimedTransport(open_transport(spec, link))
        self.rows: PoolRows | None = None
        device = jax.devices()[0]
        self.ready = dict(
            role=spec.role,
            device=f"{device.platform}:{device.device_kind}",
            devices=jax.device_count(),
            ready_s=time.monotonic() - begun,
            compile_s=self.runner.total_compile_seconds,
        )

    def engine(self) -> Engine:
        return Engine(self.model, self.args, runner=self.runner)

    def run(self, command: str) -> dict[str, Any]:
        """Serve the workload once as `command` says; its record, with the seconds compiled."""
        compiled = self.runner.total_compile_seconds
        if command == "baseline":
            record = self.baseline()
        elif self.spec.role == PREFILL:
            record = self.prefill()
        else:
            record = self.decode()
        return record | dict(compile_s=self.runner.total_compile_seconds - compiled)

    def baseline(self) -> dict[str, Any]:
        """One engine prefills and decodes every request."""
        engine, params = self.engine(), greedy(self.spec)
        todo = prompts(self.spec, self.model.config.vocab_size)
        schedule, seen, live = Schedule(len(todo), self.spec.rate), Seen(), set()
        while schedule.pending or engine.has_unfinished:
            for i in schedule.due():
                live.add(engine.add_request(todo[i], params, f"r{i}"))
            if engine.has_unfinished:
                seen.step(engine, live)
            else:
                schedule.wait()
        return seen.record() | dict(start=schedule.start, arrivals=schedule.arrivals, failed={})

    def prefill(self) -> dict[str, Any]:
        """Prefill every request as it arrives, handing each over after its first token."""
        self.transport.sent = {}
        instance = TimedPrefill(self.engine(), self.transport, self.rows, self.spec.label)
        self.rows, params = instance.rows, greedy(self.spec)
        todo = prompts(self.spec, self.model.config.vocab_size)
        schedule, failed = Schedule(len(todo), self.spec.rate), {}
        while schedule.pending or instance.has_unfinished:
            for i in schedule.due():
                instance.add_request(todo[i], params, f"r{i}")
            if not instance.has_unfinished:
                schedule.wait()
                continue
            failed |= {f.request_id: f.error for f in instance.step().failed}
        return dict(
            start=schedule.start,
            arrivals=schedule.arrivals,
            exports=instance.exports,
            sends=self.transport.sent,
            failed=failed,
        )

    def decode(self) -> dict[str, Any]:
        """Admit every request's hand-over and decode it to the end."""
        self.transport.received = {}
        instance = TimedDecode(self.engine(), self.transport, self.rows, self.spec.label)
        self.rows, engine = instance.rows, instance.engine
        seen, live, failed = Seen(), set(), {}
        for request_id in self.spec.ids:
            instance.expect(request_id, self.spec.lost_after_s)
        open_ids = set(self.spec.ids)
        while open_ids:
            arrivals = instance.receive(0.0 if engine.has_unfinished else 0.005)
            for request_id in arrivals.admitted:  # its first token, seen now
                first = engine.request(request_id).output_token_ids
                seen.note(request_id, first, instance.admits[request_id][1])
                live.add(request_id)
            for output in arrivals.finished:
                seen.note(output.request_id, output.token_ids, time.monotonic())
            failed |= {f.request_id: f.error for f in arrivals.failed}
            open_ids -= {o.request_id for o in arrivals.finished} | set(failed)
            if engine.has_unfinished:
                open_ids -= seen.step(engine, live)
        return seen.record() | dict(
            failed=failed, received=self.transport.received, admits=instance.admits
        )


def serve(control: Connection, link: Connection) -> None:
    """Build this side from the bench's `Spec` (as a dict), then answer its commands until
    "stop"."""
    side = Side(Spec(**control.recv()), link)
    control.send(side.ready)
    while (command := control.recv()) != "stop":
        control.send(side.run(command))
    side.transport.close()


if __name__ == "__main__":
    serve(Connection(int(sys.argv[1])), Connection(int(sys.argv[2])))
