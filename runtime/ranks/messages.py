"""What the front process and a rank process say to each other (pickled over a local
`multiprocessing.connection`). Front to rank: `Add`, `Abort`, `Streaming`, `StatsRequest`,
`Warmup`, `Stop`; rank to front: `Ready`, `Stepped`, `Refused`, `StatsReply`, `Snapshot`,
`WarmedUp`, `Failed`."""

from __future__ import annotations

import dataclasses
from typing import Any, Literal

from jmamba.config import ModelConfig
from runtime.core.config import EngineConfig
from runtime.core.sampling_params import SamplingParams
from runtime.observe.snapshot import EngineSnapshot
from runtime.observe.step_stats import StepStats
from runtime.outputs.request_output import RequestOutput, StreamDelta


@dataclasses.dataclass(frozen=True)
class Add:
    """Queue requests the front has checked (each `request_id` new)."""

    request_ids: list[str]
    prompts: list[list[int]]
    params: list[SamplingParams]


@dataclasses.dataclass(frozen=True)
class Abort:
    request_id: str


@dataclasses.dataclass(frozen=True)
class Streaming:
    """From now on send each step's `StreamDelta`s (True) or its finished outputs (False)."""

    on: bool


@dataclasses.dataclass(frozen=True)
class StatsRequest:
    pass


@dataclasses.dataclass(frozen=True)
class Warmup:
    """Warm up as `Engine.warmup(prefill=, sampled=, workers=)`; the rank answers `WarmedUp`."""

    prefill: bool | Literal["alone"]
    sampled: bool
    workers: int


@dataclasses.dataclass(frozen=True)
class Stop:
    pass


FrontMessage = Add | Abort | Streaming | StatsRequest | Warmup | Stop


@dataclasses.dataclass(frozen=True)
class RankInfo:
    """What the front needs to know of a rank's engine: its resolved config (the same on every
    rank), its model's; for reprs and start-up lines the parameter count, dtype, its snapshot
    and where its loading time went."""

    config: EngineConfig
    model_config: ModelConfig
    num_params: int
    dtype: Any
    snapshot: EngineSnapshot
    checkpoint_seconds: float
    setup_seconds: dict[str, float]


@dataclasses.dataclass(frozen=True)
class Ready:
    info: RankInfo


@dataclasses.dataclass(frozen=True)
class Stepped:
    """One step's finished outputs (not streaming) or stream deltas (streaming)."""

    items: list[RequestOutput] | list[StreamDelta]


@dataclasses.dataclass(frozen=True)
class Refused:
    """The rank's engine refused a request the front had accepted (its drafter's own check)."""

    request_id: str
    error: ValueError


@dataclasses.dataclass(frozen=True)
class StatsReply:
    stats: StepStats


@dataclasses.dataclass(frozen=True)
class Snapshot:
    """The rank's engine now (`EngineSnapshot`): after steps, at most every SNAPSHOT_SECONDS,
    and while it warms up."""

    snapshot: EngineSnapshot


@dataclasses.dataclass(frozen=True)
class WarmedUp:
    snapshot: EngineSnapshot


@dataclasses.dataclass(frozen=True)
class Failed:
    """The rank's engine failed (loading, or a step); the process exits after sending it."""

    message: str


RankMessage = Ready | Stepped | Refused | StatsReply | Snapshot | WarmedUp | Failed
