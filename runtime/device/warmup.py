"""`warm_up`: compile (or load) the step programs a bucket policy names, before the first step."""

from __future__ import annotations

from typing import Literal

from runtime.core.buckets import BucketPolicy
from runtime.device.model_runner import ModelRunner


def warm_up(
    runner: ModelRunner,
    buckets: BucketPolicy,
    *,
    prefill: bool | Literal["alone"],
    sampled: bool,
    progress: bool,
    workers: int,
) -> None:
    """Make ready every program of `buckets.warmup_variants(prefill)` in each of its sampler
    modes, `workers` at once; `runner.warmup_progress` counts them (`Engine.warmup` says which)."""
    modes = buckets.warmup_modes(sampled)
    runner.warmup_progress.begin(buckets.num_programs(prefill, sampled))
    for group in buckets.warmup_variants(prefill):
        runner.warmup(
            group.buckets,
            modes=modes,
            drafts=group.drafts,
            num_steps=group.steps,
            progress=progress,
            workers=workers,
        )
    runner.warmup_progress.finish()
