"""`StepRecord`: what one engine step did, as plain values (no jax).

A `Schedule` holds live `Request` objects, which keep changing after the step (tokens appended,
blocks freed, slots reused): looked at later it shows the requests' state now, not at the step.
A record copies what the step decided and what it cost at the time it ran; the engine keeps the
last `EngineArgs.step_records` of them (`Engine.records`) for notebooks and profiling.
"""

from __future__ import annotations

import dataclasses
from typing import NamedTuple

from runtime.core.buckets import Bucket
from runtime.core.sampling_inputs import SamplingMode
from runtime.core.schedule import Schedule
from runtime.observe.step_stats import StepTimer


class RowRecord(NamedTuple):
    """One scheduled request: tokens [start, start + num_tokens) of prompt + output, its state in
    slot `state_slot` (0 for a model without recurrent state)."""

    request_id: str
    start: int
    num_tokens: int
    state_slot: int


Row = tuple[str, int, int, int]  # RowRecord's fields as a plain tuple (cheaper to build)


@dataclasses.dataclass(frozen=True)
class ScheduleRecord:
    """One rank's schedule of one step, copied when it was made (rows kept as plain tuples, which
    cost a fifth of named ones on the per-step path; the properties name them)."""

    decode_rows: tuple[Row, ...]
    prefill_rows: tuple[Row, ...]
    preempted: tuple[str, ...]

    @classmethod
    def of(cls, schedule: Schedule) -> ScheduleRecord:
        def rows(items) -> tuple[Row, ...]:
            return tuple(
                [(i.request.request_id, i.start, i.num_tokens, i.request.state_slot) for i in items]
            )

        preempted = tuple(r.request_id for r in schedule.preempted)
        return cls(rows(schedule.decodes), rows(schedule.prefills), preempted)

    @property
    def decodes(self) -> list[RowRecord]:
        return [RowRecord(*row) for row in self.decode_rows]

    @property
    def prefills(self) -> list[RowRecord]:
        return [RowRecord(*row) for row in self.prefill_rows]

    @property
    def is_empty(self) -> bool:
        return not self.decode_rows and not self.prefill_rows

    @property
    def num_rows(self) -> int:
        return len(self.decode_rows) + len(self.prefill_rows)

    @property
    def num_tokens(self) -> int:
        return sum(row[2] for row in (*self.decode_rows, *self.prefill_rows))


@dataclasses.dataclass(frozen=True)
class StepRecord:
    """One engine step.

    Attributes:
      index: the step's number (0 for the engine's first step).
      bucket: the padded shape every rank ran.
      mode: the sampler's static mode.
      schedules: per local rank, what it ran (an idle rank's is empty).
      finished: ids of the requests that finished in the step.
      host_ms: schedule + build + postprocess.
      device_ms: the jitted step, from dispatch until its tokens were on the host, compile
        excluded.
      compile_seconds: compiling a variant this step needed for the first time (else 0).
    """

    index: int
    bucket: Bucket
    mode: SamplingMode
    schedules: tuple[ScheduleRecord, ...]
    finished: tuple[str, ...]
    host_ms: float
    device_ms: float
    compile_seconds: float

    @classmethod
    def of(
        cls,
        index: int,
        bucket: Bucket,
        mode: SamplingMode,
        schedules: list[ScheduleRecord],
        finished: list[str],
        timer: StepTimer,
    ) -> StepRecord:
        """A retired step's record; its times are those of the engine step that retired it."""
        return cls(
            index=index,
            bucket=bucket,
            mode=mode,
            schedules=tuple(schedules),
            finished=tuple(finished),
            host_ms=timer.host_seconds * 1e3,
            device_ms=timer.device_seconds * 1e3,
            compile_seconds=timer.compile_seconds,
        )

    @property
    def num_tokens(self) -> int:
        """Live tokens over every rank (the bucket's padding excluded)."""
        return sum(s.num_tokens for s in self.schedules)

    @property
    def num_rows(self) -> int:
        return sum(s.num_rows for s in self.schedules)

    def __str__(self) -> str:
        b = self.bucket
        shape = f"decode {b.num_decode_rows}x{b.width}, prefill {b.num_prefill_rows} rows/"
        shape += f"{b.num_prefill_tokens} tokens"
        compiled = f", compile {self.compile_seconds:.2f} s" if self.compile_seconds else ""
        return (
            f"step {self.index}: {self.num_rows} rows, {self.num_tokens} tokens in [{shape}], "
            f"host {self.host_ms:.2f} ms, device {self.device_ms:.2f} ms{compiled}"
        )
