"""`EngineSnapshot`: what a server's metrics and health read of an engine, as one plain value.

An engine in this process makes one on demand (`Engine.snapshot`); a rank process sends its
engine's with its outputs (at most every `runtime.ranks.worker.SNAPSHOT_SECONDS`), and the front
adds the ranks' together (`EngineSnapshot.total`), so `/metrics` reads the same fields whether
one process or one per rank serves.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Protocol

from runtime.core.buckets import BucketPolicy
from runtime.core.scheduler import Scheduler
from runtime.observe.step_stats import StepStats
from runtime.prefix_cache import PrefixCacheStats
from runtime.speculative.verify import SpeculationStats

if TYPE_CHECKING:  # a host module: the runner (jax) is only a type here
    from runtime.device.model_runner import ModelRunner


class Snapshotted(Protocol):
    """What a snapshot reads of an engine (an `Engine`)."""

    @property
    def schedulers(self) -> Sequence[Scheduler]: ...

    @property
    def runner(self) -> ModelRunner: ...

    @property
    def stats(self) -> StepStats: ...

    @property
    def buckets(self) -> BucketPolicy: ...

    @property
    def total_compile_seconds(self) -> float: ...


@dataclasses.dataclass(frozen=True)
class EngineSnapshot:
    """Counts of one engine (or summed over rank processes) at one moment.

    Attributes:
      num_running / num_waiting: requests being served / queued, over ranks.
      kv_blocks_used / state_slots_used: held by requests or by the prefix cache.
      prefix_cache: its counters summed over ranks; None when caching is off.
      speculation: acceptance counters summed over ranks.
      num_drafting_steps: steps that drafted.
      num_variants / num_loaded / num_compiled: step programs ready; of them loaded from the
        step store, compiled.
      compile_seconds: seconds compiling (the target's runner and the drafter's), per process.
      programs_possible: step programs a serving warm-up makes ready (`--warmup all`).
      warmup: the warm-up's progress (`WarmupProgress.snapshot`).
    """

    num_running: int
    num_waiting: int
    kv_blocks_used: int
    state_slots_used: int
    prefix_cache: PrefixCacheStats | None
    speculation: SpeculationStats
    num_drafting_steps: int
    num_variants: int
    num_loaded: int
    num_compiled: int
    compile_seconds: float
    programs_possible: int
    warmup: dict[str, Any]

    @classmethod
    def of(cls, engine: Snapshotted) -> EngineSnapshot:
        schedulers, runner = engine.schedulers, engine.runner
        return cls(
            num_running=sum(len(s.running) for s in schedulers),
            num_waiting=sum(len(s.waiting) for s in schedulers),
            kv_blocks_used=sum(s.block_pool.num_used for s in schedulers),
            state_slots_used=sum(s.slot_pool.num_used for s in schedulers),
            prefix_cache=engine.stats.prefix_cache,
            speculation=engine.stats.speculation,
            num_drafting_steps=engine.stats.num_drafting_steps,
            num_variants=runner.num_variants,
            num_loaded=len(runner.load_seconds),
            num_compiled=len(runner.compile_seconds),
            compile_seconds=engine.total_compile_seconds,
            programs_possible=engine.buckets.num_serving_programs,
            warmup=runner.warmup_progress.snapshot(),
        )

    @classmethod
    def total(cls, parts: list[EngineSnapshot]) -> EngineSnapshot:
        """The rank processes' snapshots as one: counts summed; programs and compile seconds of
        the rank with the most (the ranks compile beside each other); the warm-up as far as
        the slowest rank is."""
        caches = [p.prefix_cache for p in parts if p.prefix_cache is not None]
        warmups = [p.warmup for p in parts]
        return cls(
            num_running=sum(p.num_running for p in parts),
            num_waiting=sum(p.num_waiting for p in parts),
            kv_blocks_used=sum(p.kv_blocks_used for p in parts),
            state_slots_used=sum(p.state_slots_used for p in parts),
            prefix_cache=PrefixCacheStats.total(caches) if caches else None,
            speculation=SpeculationStats.total([p.speculation for p in parts]),
            num_drafting_steps=sum(p.num_drafting_steps for p in parts),
            num_variants=max(p.num_variants for p in parts),
            num_loaded=max(p.num_loaded for p in parts),
            num_compiled=max(p.num_compiled for p in parts),
            compile_seconds=max(p.compile_seconds for p in parts),
            programs_possible=max(p.programs_possible for p in parts),
            warmup=_slowest(warmups),
        )


def _slowest(warmups: list[dict[str, Any]]) -> dict[str, Any]:
    """Every rank warms the same programs: ready counts of the slowest, its seconds so far."""
    ahead = {"programs_total", "seconds"}
    return {key: (max if key in ahead else min)(w[key] for w in warmups) for key in warmups[0]}
