"""`EngineView`: read-only views into an engine, for people looking inside it (no jax).

The engine hands one out (`Engine.inspect`): the scheduler, last schedule and last batch of a
single-rank engine, which requests own which KV blocks and state slots. It reads only the
engine's public attributes (`ranks`, `schedulers`, `last_schedules`, `last_batches`) and changes
nothing.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from runtime.core.schedule import Schedule
from runtime.core.scheduler import Scheduler
from runtime.core.step_batch import StepBatch


class Inspectable(Protocol):
    """What a view reads of an engine (read only)."""

    @property
    def ranks(self) -> Sequence[int]: ...

    @property
    def schedulers(self) -> Sequence[Scheduler]: ...

    @property
    def last_schedules(self) -> Sequence[Schedule]: ...

    @property
    def last_batches(self) -> Sequence[StepBatch]: ...


class EngineView:
    """Read-only views of an engine (see the module docstring)."""

    def __init__(self, engine: Inspectable) -> None:
        self._engine = engine

    @property
    def scheduler(self) -> Scheduler:
        """The scheduler of a single-rank engine (`schedulers[i]` serves rank `ranks[i]`)."""
        self._one_rank()
        return self._engine.schedulers[0]

    @property
    def last_schedule(self) -> Schedule | None:
        """The last step's schedule of a single-rank engine (`last_schedules` per rank). It holds
        the live `Request`s, which show their state now, not at the step: `Engine.records` holds
        copies made at each step."""
        return self._only_rank(self._engine.last_schedules)

    @property
    def last_batch(self) -> StepBatch | None:
        """The last step's inputs of a single-rank engine (`last_batches` per rank)."""
        return self._only_rank(self._engine.last_batches)

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
        ranks = self._engine.ranks
        if rank not in ranks:
            raise ValueError(f"rank={rank!r} is not a rank of this process: {ranks}")
        return self._engine.schedulers[ranks.index(rank)]

    def _only_rank[T](self, per_rank: Sequence[T]) -> T | None:
        """The one rank's entry of `per_rank` (None: empty, before the first step)."""
        self._one_rank()
        return per_rank[0] if per_rank else None

    def _one_rank(self) -> None:
        num_ranks = len(self._engine.schedulers)
        if num_ranks != 1:
            raise ValueError(f"this engine drives {num_ranks} ranks: index the per-rank list")
