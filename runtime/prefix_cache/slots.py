"""`CachingSlots`: the slot planner of a rank with prefix caching on (no jax).

On top of `PlainSlots` (each request reads and writes its own slot), for each scheduled row: the
slot it reads (a cached one after a hit), the slot it writes (a fresh cache slot for a decode
step that ends on a state block boundary in "all" mode), the boundary states a prefill writes for
the cache; after the step, what the cache publishes and, for a decode row with drafts, which
accepted lanes give their state to the cache. The cache itself (`PrefixCache`) keeps the keys,
the LRU order and the budgets; this planner keeps what it knows per request:

- `_reads[request]`: a cached state slot the request's next step reads instead of its own
  (after a hit, or after a decode step wrote a boundary state to a cache slot); the request
  holds a reference on it until that step is dispatched;
- `_offered[request]`: its leading KV blocks already offered to the cache.

runtime/core/scheduler.py decides which rows run; this module only gives them their slots.
"""

from __future__ import annotations

import numpy as np

from runtime.core.config import EngineConfig
from runtime.core.pools import NULL
from runtime.core.request import Request, RequestStatus
from runtime.core.schedule import ScheduledRequest
from runtime.core.slots import Hit, PlainSlots
from runtime.prefix_cache.cache import PrefixCache
from runtime.prefix_cache.events import CacheEvents, RecordedEvents


class CachingSlots(PlainSlots):
    """Slots of rows and prefix-cache bookkeeping for one rank's pools ("align" or "all")."""

    def __init__(
        self, config: EngineConfig, *, uses_blocks: bool, uses_slots: bool, rank: int = 0
    ) -> None:
        """`rank`: the rank's id in the engine's mesh, which its cache events name."""
        super().__init__(config, uses_blocks=uses_blocks, uses_slots=uses_slots)
        self.events = cache_events(config, rank)
        self.cache = PrefixCache(
            self.block_pool,
            self.slot_pool,
            block_size=config.block_size,
            state_block_size=config.state_block_size,
            max_cached_states=config.max_cached_states,
            uses_blocks=uses_blocks,
            uses_slots=uses_slots,
            events=self.events,
        )
        self.stats = self.cache.stats
        self.state_block_size = config.state_block_size
        # "all": a decode step ending on a state block boundary writes its state to the cache,
        # and so do the accepted lanes of a row with drafts; "align": only prefill chunk ends.
        self.caches_every_boundary = config.prefix_caching == "all"
        self._reads: dict[Request, int] = {}
        self._offered: dict[Request, int] = {}

    # ------------------------------------------------------------------------------- admission

    def take_hit(self, request: Request) -> Hit:
        """Start the request after its longest cached prefix, holding references on it."""
        hit = self.cache.lookup(request)
        if hit.num_tokens:
            self.cache.acquire(hit)
            request.num_computed = hit.num_tokens
            request.block_ids = list(hit.block_ids)
            self._offered[request] = len(hit.block_ids)
            if hit.slot:
                self._reads[request] = hit.slot
        return hit

    def drop_hit(self, request: Request, hit: Hit) -> None:
        if not hit.num_tokens:
            return
        self.block_pool.free(hit.block_ids)
        self.slot_pool.free([hit.slot] if hit.slot else [])
        request.num_computed, request.block_ids = 0, []
        self._reads.pop(request, None)
        self._offered.pop(request, None)

    def admitted(self, request: Request, hit: Hit) -> None:
        self.cache.touch(request, hit)
        request.num_cached_tokens = hit.num_tokens

    # ------------------------------------------------------------------------------- pools

    def can_allocate_blocks(self, n: int) -> bool:
        return self.cache.can_allocate_blocks(n)

    def allocate_blocks(self, n: int) -> list[int]:
        return self.cache.allocate_blocks(n)

    def free_for_lanes(self) -> int:
        """Free state slots less what the cache's state budget may still take."""
        return super().free_for_lanes() - self.cache.unused_state_budget

    def release(self, request: Request) -> None:
        read = self._reads.pop(request, NULL)
        if read:
            self.slot_pool.free([read])
        self._offered.pop(request, None)
        super().release(request)

    # ------------------------------------------------------------------------------- rows

    def read_slot(self, request: Request) -> int:
        return self.cached_read(request) or self.own_slot(request)

    def cached_read(self, request: Request) -> int:
        """The cached slot the request's next step reads instead of its own (NULL: none)."""
        return self._reads.get(request, NULL)

    def decode_row(self, request: Request) -> ScheduledRequest:
        """A one-token decode row; in "all" mode one that ends on a state block boundary writes
        its state to a fresh cache slot, which the request reads next step."""
        end = request.num_computed + 1
        row = super().decode_row(request)
        if not (
            self.uses_slots and self.caches_every_boundary and end % self.state_block_size == 0
        ):
            return row
        if request.num_pending:  # asynchronous: the token it feeds is still on the device
            key, slot = None, self.cache.reserve_unkeyed_state()
        else:
            key = self.cache.state_key(request, end)
            slot = self.cache.reserve_state(key)
        if not slot:
            return row
        self._overwritten.discard(request)  # it writes the cache slot, not a last lane
        return row._replace(write_slot=slot, new_states=((key, slot),))

    def prefill_row(self, item: ScheduledRequest) -> ScheduledRequest:
        """The chunk with its slots, and a fresh cache slot for each state block boundary it
        writes ("all": every one it crosses; "align": its end, when that is one)."""
        item = super().prefill_row(item)
        if not self.uses_slots:
            return item
        sbs, end = self.state_block_size, item.start + item.num_tokens
        first, last = item.start // sbs + 1, end // sbs  # boundaries crossed: first * sbs, ...
        wanted = range(first, last + 1)
        if not self.caches_every_boundary:  # only a chunk end on a boundary
            wanted = range(last, last + 1) if end % sbs == 0 else range(0)
        columns, new = [NULL] * max(last - first + 1, 0), []
        for boundary in wanted:
            key = self.cache.state_key(item.request, boundary * sbs)
            slot = self.cache.reserve_state(key)
            if slot:
                columns[boundary - first] = slot
                new.append((key, slot))
        return item._replace(boundary_slots=tuple(columns), new_states=tuple(new))

    # ------------------------------------------------------------------------------- after

    def advance(self, item: ScheduledRequest) -> None:
        """Once the row's step is dispatched: the request stops reading the cached slot the row
        read (dropping its reference); a decode that wrote its state to a cache slot reads it
        next step (holding a reference), with no copy. Device order keeps this safe before the
        step has run: a slot given back now is reused only by a later step."""
        request = item.request
        read = self._reads.get(request, NULL)
        if read and item.read_slot == read:
            self.slot_pool.free([read])
            del self._reads[request]
        if item.write_slot and item.write_slot != self.own_slot(request):
            self.slot_pool.share([item.write_slot])
            self._reads[request] = item.write_slot
        super().advance(item)

    def keep_lane(self, item: ScheduledRequest, lane: int) -> None:
        """In "all" mode the accepted lanes (0..lane) that end on a state block boundary first
        give their slot to the cache (their step has run, so they are published at once). When
        the kept lane is one of them, its state is the cache's: the request reads it next step
        (holding the lane's reference) and keeps its own slot to write, so no step writes a
        published slot. Nor does a one-token row dispatched after this one that writes the kept
        lane in place (`PlainSlots.decode_row`: the last lane, or chained the last accepted
        one): that lane is not offered. Call it after `advance`, which drops what the row
        read."""
        if not (self.uses_slots and self.caches_every_boundary):
            return super().keep_lane(item, lane)
        request, lanes = item.request, item.lane_slots
        offered = lane + 1 - self._verified(request)
        kept_published = False
        for t in range(offered):
            end = item.start + t + 1  # tokens summarised by lane t's state
            if end % self.state_block_size == 0 and end <= request.num_tokens:
                key = self.cache.state_key(request, end)
                kept_published = self.cache.adopt_state(key, lanes[t], request) and t == lane
        if not kept_published:
            return super().keep_lane(item, lane)
        self._reads[request] = lanes[lane]
        self.slot_pool.free([*lanes[:lane], *lanes[lane + 1 :]])

    def retired(self, item: ScheduledRequest) -> None:
        """Publish the states the row wrote and the KV blocks its request filled. An unkeyed
        state (key None) is keyed now by the tokens it summarises, known once the step before has
        retired (unknown only for a request aborted with its token pending). A finished
        request's states are valid and published; its blocks went back when it finished."""
        request, end = item.request, item.start + item.num_tokens
        for key, slot in item.new_states:
            if key is not None:
                self.cache.publish_state(key, request)
            else:
                known = request.num_tokens >= end
                key = self.cache.state_key(request, end) if known else None
                self.cache.key_state(slot, key, request)
        offered = self._offered.get(request, 0)
        if request.status is RequestStatus.RUNNING and (
            request.num_computed // self.config.block_size > offered
        ):
            self._offered[request] = self.cache.publish_blocks(request, offered)

    def end_step(self) -> None:
        """The step's retirement is over: its cache events go out as one batch."""
        self.events.end_step()

    @property
    def published_slots(self) -> np.ndarray:
        return self.cache.published_slots

    @property
    def published_blocks(self) -> np.ndarray:
        return self.cache.published_blocks


def cache_events(config: EngineConfig, rank: int) -> CacheEvents:
    """The sink of rank `rank` (its id in the engine's mesh: `Engine.ranks`, global in a
    multi-host run) under `config.kv_events_config`:
    `RecordedEvents` over a ZMQ publisher on the rank's endpoint when events are on (pyzmq and
    msgspec imported then), else the no-op `CacheEvents`."""
    events = config.kv_events_config
    if events is None or not events.publishes:
        return CacheEvents()
    from runtime.prefix_cache.publisher import ZmqPublisher  # pyzmq: only when events are on

    global_rank = events.data_parallel_rank + rank
    publisher = ZmqPublisher(events, global_rank)
    return RecordedEvents(publisher, block_size=config.block_size, rank=global_rank)
