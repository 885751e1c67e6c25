"""`StepStats` and `RankStats`: what an engine's steps cost and did, accumulated (no jax)."""

from __future__ import annotations

import dataclasses

from runtime.prefix_cache import PrefixCacheStats
from runtime.speculative import SpeculationStats


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
    compiling excluded) and compile seconds (first use of each step variant)."""

    num_steps: int = 0
    host_seconds: float = 0.0
    device_seconds: float = 0.0
    compile_seconds: float = 0.0
    ranks: list[RankStats] = dataclasses.field(default_factory=list)

    @property
    def speculation(self) -> SpeculationStats:
        """Acceptance counters summed over ranks (`acceptance_rate`, `mean_acceptance_length`)."""
        total = SpeculationStats()
        for rank in self.ranks:
            total = total.add(rank.speculation)
        return total
