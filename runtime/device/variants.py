"""The names of a compiled step variant: `VariantKey` (what it is specialised on), `Variant` (one
about to be loaded or compiled) and `DispatchedStep` (one handed to the device)."""

from __future__ import annotations

import dataclasses
from typing import NamedTuple

import jax

from runtime.core.buckets import Bucket
from runtime.core.sampling_inputs import SamplingMode, TokenLogprobs
from runtime.core.step_batch import StepBatch
from runtime.device.spmd_step import StepSpec


class Variant(NamedTuple):
    """A variant about to be loaded or compiled: its static spec, its packed input slot's
    array and the description that keys it in the `ExecutableStore`."""

    spec: StepSpec
    packed: jax.Array
    description: str


class VariantKey(NamedTuple):
    """What a compiled step is specialised on: its bucket (shapes), the sampler's mode, whether
    it drafts on the device (an MTP engine's steps; False for every step of an engine that
    drafts nowhere or on the host), and how many steps one call runs (`dispatch_steps`)."""

    bucket: Bucket
    mode: SamplingMode
    drafts: bool
    steps: int = 1


@dataclasses.dataclass(frozen=True)
class DispatchedStep:
    """A program handed to the device whose outputs may not be computed yet: one step
    (`ModelRunner.dispatch`; `fetch` waits for it) or several (`dispatch_steps`, `fetch_steps`;
    each output then has a step axis after the rank's). `parts[j]`: step j's batch per rank."""

    parts: list[list[StepBatch]]
    tokens: jax.Array
    token_logprobs: TokenLogprobs[jax.Array] | None
    logits: jax.Array | None
