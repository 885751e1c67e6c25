"""`LaunchedStep`: an engine step handed to the device, and what retiring it needs;
`LaunchedProgram`: the steps one dispatched program runs (the engine retires it in the same call,
or, with asynchronous scheduling, in the next)."""

from __future__ import annotations

import dataclasses

from runtime.core.buckets import Bucket
from runtime.core.sampling_inputs import SamplingMode
from runtime.core.schedule import Schedule
from runtime.core.step_batch import StepBatch
from runtime.device.variants import DispatchedStep
from runtime.observe.step_record import ScheduleRecord


@dataclasses.dataclass(frozen=True)
class LaunchedStep:
    """A step and what its retirement needs: its number, shape, sampler mode, each rank's
    schedule and batch, (with step records) the schedules' records, and whether it drafted."""

    index: int
    bucket: Bucket
    mode: SamplingMode
    schedules: list[Schedule]
    batches: list[StepBatch]
    snapshots: list[ScheduleRecord]
    drafted: bool


@dataclasses.dataclass(frozen=True)
class LaunchedProgram:
    """A dispatched program: its steps in the order they run (one, or several decode steps:
    `EngineArgs.decode_steps`) and the device handle of their outputs."""

    steps: list[LaunchedStep]
    dispatched: DispatchedStep
