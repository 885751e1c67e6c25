"""The drafter contract (`Drafter`), the drafter of an engine without speculation (`NoDrafts`), and
`make_drafter`, which builds the one a config asks for.

An engine always holds a drafter and calls it at fixed points of every step that drafts (its
`DraftGate` says which do, `runtime.speculative.gate`), so it never asks whether speculation is
on: `num_wanted` (inside the scheduler, per decode row: how many drafts it would propose),
`propose` (after the ranks agreed on the step's bucket: the decode rows given k > 0 lanes get
their k drafts), `dispatched` (every dispatched step, once its rows moved on), `observe` (every
retired step), `release_done` (after retirement and aborts: give back what finished or preempted
requests held). With `NoDrafts` no step drafts and every
row is a plain one-token decode row.
"""

from __future__ import annotations

from typing import Protocol

import numpy as np

from jmamba.loading import load_model
from jmamba.model import HybridLM
from runtime.core.buckets import Bucket
from runtime.core.config import EngineConfig
from runtime.core.request import Request
from runtime.core.sampling_params import SamplingParams
from runtime.core.schedule import Schedule
from runtime.device.chaining import carried_tokens
from runtime.device.model_runner import ModelRunner
from runtime.speculative.draft_model import DraftModelDrafter, check_draft_model
from runtime.speculative.mtp import MTPDrafter
from runtime.speculative.ngram import NgramDrafter


class Drafter(Protocol):
    """Proposes drafts for decode rows (see the module docstring)."""

    def check(self, params: SamplingParams) -> None:
        """ValueError for sampling params this drafter's engine cannot serve."""

    def num_wanted(self, request: Request) -> int:
        """How many drafts it would propose for the request's next decode row."""

    def propose(self, schedules: list[Schedule], bucket: Bucket) -> list[Schedule]:
        """The schedules (one per local rank) with each decode row of 1 + k lanes given its k
        drafts (`ScheduledRequest.draft_token_ids`)."""

    def dispatched(
        self, schedule: Schedule, bucket: Bucket, moved: list[bool], drafted: bool
    ) -> None:
        """One rank's step was dispatched (`drafted`: with drafts) and `Scheduler.advance` moved
        the items flagged in `moved` on."""

    def observe(self, schedule: Schedule, bucket: Bucket, drafts: np.ndarray | None) -> None:
        """One rank's retired step and the drafts its step made on the device (`None` unless the
        step drafts: `runtime.device.mtp_drafts`)."""

    def release_done(self) -> None:
        """Give back what finished, aborted or preempted requests held."""

    def warmup(self) -> None:
        """Compile what proposing will run."""

    @property
    def total_compile_seconds(self) -> float:
        """Seconds the drafter spent compiling so far (counted apart from run time)."""


class NoDrafts:
    """The drafter of an engine without speculative decoding: it never proposes."""

    total_compile_seconds = 0.0

    def check(self, params: SamplingParams) -> None:
        """Every request can be served."""

    def num_wanted(self, request: Request) -> int:
        return 0

    def propose(self, schedules: list[Schedule], bucket: Bucket) -> list[Schedule]:
        return schedules

    def dispatched(
        self, schedule: Schedule, bucket: Bucket, moved: list[bool], drafted: bool
    ) -> None:
        """Nothing was drafted."""

    def observe(self, schedule: Schedule, bucket: Bucket, drafts: np.ndarray | None) -> None:
        """Learns nothing from a step."""

    def release_done(self) -> None:
        """Holds nothing."""

    def warmup(self) -> None:
        """Compiles nothing."""


def make_drafter(
    config: EngineConfig,
    model: HybridLM,
    num_ranks: int,
    draft_model: HybridLM | None = None,
    draft_runner: ModelRunner | None = None,
) -> Drafter:
    """The drafter `config.speculative` asks for (`NoDrafts` without speculation). For
    "draft_model", `draft_model` is the draft model (default: loaded from
    `config.speculative.draft_model`) and `draft_runner` may share another engine's compiled
    draft steps and caches."""
    spec = config.speculative
    if spec is None or spec.method != "draft_model":
        if draft_model is not None or draft_runner is not None:
            raise ValueError("draft_model / draft_runner need speculative method 'draft_model'")
    if spec is None:
        return NoDrafts()
    if spec.method == "ngram":
        return NgramDrafter(spec)
    if spec.method == "mtp":
        check_mtp_head(model)
        return MTPDrafter(spec, carried_tokens(config))
    if draft_model is None:
        if spec.draft_model is None:
            raise ValueError(
                "speculative method 'draft_model' needs draft_model: a checkpoint directory or "
                "preset name, or the model object"
            )
        draft_model, _ = load_model(spec.draft_model, seed=config.seed)
    checked = check_draft_model(draft_model, model)
    return DraftModelDrafter(checked, config, num_ranks, runner=draft_runner)


def check_mtp_head(model: object) -> None:
    """ValueError unless `model` has a multi-token-prediction head (`jmamba.mtp`)."""
    config = getattr(model, "config", None)
    if not getattr(config, "has_mtp", False):
        name = getattr(config, "architecture", type(model).__name__)
        raise ValueError(
            f"speculative method 'mtp' needs a model with an MTP head; {name} has none (its "
            "checkpoint holds no mtp.* tensors, or its config.json no MTP layer count)"
        )
