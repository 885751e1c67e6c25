"""`EngineIntrospection`: the engine's read-only views for people looking inside it (no jax).

Per-rank accessors of a single-rank engine (`scheduler`, `last_schedule`, `last_batch`), the
live request of an id, which requests own which KV blocks and state slots, the prefix cache
counters and the engine's repr. A mixin of `runtime.engine.Engine`: it reads the engine's
`schedulers`, `ranks`, `last_schedules`, `last_batches`, `stats`, `config`, `model_config`,
`tokenizer` and `_requests`, and changes nothing.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from runtime import checks
from runtime.prefix_cache import PrefixCacheStats
from runtime.request import Request

if TYPE_CHECKING:
    from runtime.builder import StepBatch
    from runtime.scheduler import Schedule, Scheduler


class EngineIntrospection:
    """Read-only views of an `Engine` (see the module docstring)."""

    @property
    def scheduler(self) -> Scheduler:
        """The scheduler of a single-rank engine (`schedulers[i]` serves rank `ranks[i]`)."""
        return self._only_rank(self.schedulers)

    @property
    def last_schedule(self) -> Schedule | None:
        """The last step's schedule of a single-rank engine (`last_schedules` per rank). It holds
        the live `Request`s, which show their state now, not at the step: `records` holds
        copies made at each step."""
        return self._only_rank(self.last_schedules)

    @property
    def last_batch(self) -> StepBatch | None:
        """The last step's inputs of a single-rank engine (`last_batches` per rank)."""
        return self._only_rank(self.last_batches)

    @property
    def prefix_cache_stats(self) -> PrefixCacheStats | None:
        """The prefix cache counters of this process's ranks, summed (a fresh copy; per rank:
        `stats.ranks[i].prefix_cache`); None when prefix caching is off."""
        parts = [rank.prefix_cache for rank in self.stats.ranks if rank.prefix_cache is not None]
        return PrefixCacheStats.total(parts) if parts else None

    def request(self, request_id: str | int) -> Request:
        """The live (waiting or running) request with this id."""
        request_id = checks.request_id(request_id)
        if request_id not in self._requests:
            raise ValueError(f"request_id={request_id!r} is not a live request of this engine")
        return self._requests[request_id]

    def block_owners(self, rank: int = 0) -> dict[int, list[str]]:
        """KV block id -> ids of the running requests holding it, in rank `rank`'s own pool."""
        owners: dict[int, list[str]] = {}
        for request in self._scheduler_of(rank).running:
            for block in request.block_ids:
                owners.setdefault(block, []).append(request.request_id)
        return owners

    def slot_owners(self, rank: int = 0) -> dict[int, str]:
        """State slot id -> id of the running request whose state it holds, in rank `rank`'s
        own pool."""
        running = self._scheduler_of(rank).running
        return {r.state_slot: r.request_id for r in running if r.state_slot}

    def _scheduler_of(self, rank: int) -> Scheduler:
        if rank not in self.ranks:
            raise ValueError(f"rank={rank!r} is not a rank of this process: {self.ranks}")
        return self.schedulers[self.ranks.index(rank)]

    def __repr__(self) -> str:
        waiting = sum(len(s.waiting) for s in self.schedulers)
        running = sum(len(s.running) for s in self.schedulers)
        config = self.config
        return (
            f"Engine({self.model_config.architecture}, ranks={len(self.ranks)}, "
            f"running={running}, waiting={waiting}, steps={self.stats.num_steps}, "
            f"variants={self.num_variants}, max_num_seqs={config.max_num_seqs}, "
            f"max_model_len={config.max_model_len}, "
            f"tokenizer={'yes' if self.tokenizer is not None else 'none'})"
        )

    def _only_rank[T](self, per_rank: list[T]) -> T | None:
        if len(self.schedulers) != 1:
            raise ValueError(
                f"this engine drives {len(self.schedulers)} ranks: index the per-rank list"
            )
        return per_rank[0] if per_rank else None
