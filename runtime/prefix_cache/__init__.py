"""Prefix caching: full KV blocks and recurrent states at block boundaries, shared by later
requests whose prompts start the same way.

`cache.py` keeps one rank's entries (keys, reference counts, LRU order, the state budget);
`slots.py` is the rank's slot planner with caching on (`CachingSlots`: hits, boundary states,
publication after the step); `events.py` what the cache stores and drops, in vLLM's KV events
schema, and `publisher.py` the ZMQ sockets that send them to KV-aware routers. `slot_planner`
picks the planner a config asks for: the scheduler never asks whether caching is on.
docs/architecture.md, "Prefix caching", has the design.
"""

from __future__ import annotations

from runtime.core.config import EngineConfig
from runtime.core.slots import Hit, PlainSlots, PrefixCacheStats, SlotPlanner
from runtime.prefix_cache.cache import PrefixCache
from runtime.prefix_cache.slots import CachingSlots

__all__ = ["CachingSlots", "Hit", "PrefixCache", "PrefixCacheStats", "slot_planner"]


def slot_planner(
    config: EngineConfig, rank: int = 0, *, uses_blocks: bool, uses_slots: bool
) -> SlotPlanner:
    """Rank `rank`'s slot planner: `CachingSlots` (publishing cache events when
    `config.kv_events_config` asks) when `config` caches prefixes, else `PlainSlots`.
    `uses_blocks` / `uses_slots`: whether the model has attention / recurrent layers."""
    if not config.caches_prefixes:
        return PlainSlots(config, uses_blocks=uses_blocks, uses_slots=uses_slots)
    return CachingSlots(config, uses_blocks=uses_blocks, uses_slots=uses_slots, rank=rank)
