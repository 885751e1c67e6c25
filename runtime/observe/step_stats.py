"""`StepStats` and `RankStats`: what an engine's steps cost and did, accumulated; `StepTimer`:
where one step's wall time goes (no jax)."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from typing import Any, Protocol, TypeVar

from runtime.core.schedule import Schedule
from runtime.prefix_cache import PrefixCacheStats
from runtime.speculative.verify import SpeculationStats

T = TypeVar("T")


@dataclasses.dataclass
class RankStats:
    """Per data-parallel rank: steps with live rows, idle (all-padding) steps, tokens computed
    (drafts fed included), the speculative acceptance counters, and the counters of its prefix
    cache (lookups, hits, tokens skipped, evictions; None when prefix caching is off)."""

    num_live_steps: int = 0
    num_idle_steps: int = 0
    num_tokens: int = 0
    prefix_cache: PrefixCacheStats | None = None
    speculation: SpeculationStats = dataclasses.field(default_factory=SpeculationStats)


@dataclasses.dataclass
class StepStats:
    """Accumulated wall time: host (schedule + build + postprocess), device (the jitted step,
    compiling excluded) and compile seconds (first use of each step variant); steps dispatched,
    and of them the steps that drafted (the draft gate's choice)."""

    num_steps: int = 0
    num_drafting_steps: int = 0
    host_seconds: float = 0.0
    device_seconds: float = 0.0
    compile_seconds: float = 0.0
    ranks: list[RankStats] = dataclasses.field(default_factory=list)

    @classmethod
    def of_ranks(cls, prefix_caches: list[PrefixCacheStats | None]) -> StepStats:
        """Zeroed stats of ranks whose prefix caches count into `prefix_caches` (None: off)."""
        return cls(ranks=[RankStats(prefix_cache=cache) for cache in prefix_caches])

    @classmethod
    def of_processes(cls, parts: list[StepStats]) -> StepStats:
        """The counters of engines in several processes (a process per rank) as one: seconds and
        steps summed over the processes (each process dispatches its own), ranks in order."""
        return cls(
            num_steps=sum(p.num_steps for p in parts),
            num_drafting_steps=sum(p.num_drafting_steps for p in parts),
            host_seconds=sum(p.host_seconds for p in parts),
            device_seconds=sum(p.device_seconds for p in parts),
            compile_seconds=sum(p.compile_seconds for p in parts),
            ranks=[rank for p in parts for rank in p.ranks],
        )

    @property
    def speculation(self) -> SpeculationStats:
        """Acceptance counters summed over ranks (`acceptance_rate`, `mean_acceptance_length`;
        a fresh copy)."""
        return SpeculationStats.total([rank.speculation for rank in self.ranks])

    @property
    def prefix_cache(self) -> PrefixCacheStats | None:
        """Prefix cache counters summed over ranks (a fresh copy; per rank:
        `ranks[i].prefix_cache`); None when prefix caching is off."""
        parts = [rank.prefix_cache for rank in self.ranks if rank.prefix_cache is not None]
        return PrefixCacheStats.total(parts) if parts else None

    def count(self, timer: StepTimer, steps: list[list[Schedule]] | None, drafted: bool) -> None:
        """Add one engine step: its `timer`'s seconds and, when it dispatched a program (`steps`:
        each of its steps' schedules, one per rank), its steps, whether it drafted, and each
        rank's live or idle steps and the tokens they computed."""
        self.host_seconds += timer.host_seconds
        self.device_seconds += timer.device_seconds
        self.compile_seconds += timer.compile_seconds
        if steps is None:
            return
        self.num_steps += len(steps)
        self.num_drafting_steps += drafted
        for schedules in steps:
            self._count_ranks(schedules)

    def _count_ranks(self, schedules: list[Schedule]) -> None:
        """Count one step of each rank: live (and its tokens) or idle."""
        for rank, schedule in zip(self.ranks, schedules, strict=True):
            if schedule.is_empty:
                rank.num_idle_steps += 1
            else:
                rank.num_live_steps += 1
                rank.num_tokens += sum(item.num_tokens for item in schedule.items)


class CompileClock(Protocol):
    """What a timer reads of whatever compiles during a step (the model runner, the drafter's
    runner): its running total of compile seconds."""

    @property
    def total_compile_seconds(self) -> float: ...


class StepTimer:
    """One engine step's wall time split three ways: compile (whatever any of `clocks` compiled
    during the step, the drafter's passes included), device (the runner calls made through
    `device`, less what they compiled), and host (the rest, at `stop`)."""

    def __init__(self, clocks: list[CompileClock]) -> None:
        self._clocks = clocks
        self._start = self._compiled_at_start = 0.0
        self.host_seconds = self.device_seconds = self.compile_seconds = 0.0

    def start(self) -> None:
        self._start = time.perf_counter()
        self._compiled_at_start = self._compiled()
        self.device_seconds = self.compile_seconds = 0.0

    def device(self, call: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """`call(*args, **kwargs)` (a runner's dispatch or fetch), timed as device time."""
        compiled_before = self._compiled()
        start = time.perf_counter()
        result = call(*args, **kwargs)
        compiled = self._compiled() - compiled_before
        self.device_seconds += time.perf_counter() - start - compiled
        return result

    def stop(self) -> None:
        elapsed = time.perf_counter() - self._start
        self.compile_seconds = self._compiled() - self._compiled_at_start
        self.host_seconds = elapsed - self.device_seconds - self.compile_seconds

    @property
    def run_seconds(self) -> float:
        """The step's host and device seconds (its wall time less what it compiled)."""
        return self.host_seconds + self.device_seconds

    def _compiled(self) -> float:
        return sum(clock.total_compile_seconds for clock in self._clocks)
