"""One-line descriptions of a `Pool` and a `Scheduler` for notebooks and logs (no jax)."""

from __future__ import annotations

from runtime.core.pools import Pool
from runtime.core.scheduler import Scheduler

_LISTED = 6  # request ids listed before "..."


def describe_pool(pool: Pool) -> str:
    """Name, size (NULL id 0 included), ids in use, free, and shared (reference count > 1)."""
    shared = int((pool.ref_counts > 1).sum())
    return (
        f"Pool({pool.name!r}, size={pool.size}, used={pool.num_used}, free={pool.num_free}"
        f"{f', shared={shared}' if shared else ''})"
    )


def describe_scheduler(scheduler: Scheduler) -> str:
    """Running and waiting request ids (oldest first), pool use, budget and preemptions."""

    def ids(requests) -> str:
        shown = [r.request_id for r in requests[:_LISTED]]
        return repr(shown)[:-1] + (", ...]" if len(requests) > _LISTED else "]")

    pools = []
    if scheduler.uses_blocks:
        pools.append(f"blocks {scheduler.block_pool.num_used}/{scheduler.block_pool.size - 1}")
    if scheduler.uses_slots:
        pools.append(f"slots {scheduler.slot_pool.num_used}/{scheduler.slot_pool.size - 1}")
    return (
        f"Scheduler(running={ids(scheduler.running)}, waiting={ids(scheduler.waiting)}, "
        f"{', '.join(pools) or 'no pools'} used, budget={scheduler.budget} tokens, "
        f"preemptions={scheduler.num_preemptions})"
    )
