"""One-line descriptions of a `Pool`, a `Scheduler` and an `Engine` (its repr) for notebooks and
logs (no jax)."""

from __future__ import annotations

from typing import Any

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


def describe_engine(engine: Any) -> str:
    """One line: the engine's model, ranks, requests, steps, compiled variants, limits and cache
    dtypes (its repr)."""
    waiting = sum(len(s.waiting) for s in engine.schedulers)
    running = sum(len(s.running) for s in engine.schedulers)
    config = engine.config
    return (
        f"Engine({engine.model_config.architecture}, ranks={len(engine.ranks)}, "
        f"running={running}, waiting={waiting}, steps={engine.stats.num_steps}, "
        f"variants={engine.num_variants}, max_num_seqs={config.max_num_seqs}, "
        f"max_model_len={config.max_model_len}, {config.cache_dtypes.describe()}, "
        f"tokenizer={'yes' if engine.tokenizer is not None else 'none'})"
    )
