"""`RowSlots`: the state slots a step's rows read and write, and the prefix-cache bookkeeping
around them (no jax).

For each scheduled row: the slot it reads (its own, a cached one after a hit, NULL for a first
chunk), the slot it writes (its own, or a fresh cache slot for a state block boundary), the
boundary states a prefill writes for the cache; after the step, what the cache publishes and,
for a speculative decode row, which lane's state the request keeps. runtime/scheduler.py decides
which rows run; this module only gives them their slots (module docstring there, steps 3 and 5).
"""

from __future__ import annotations

from runtime.config import EngineConfig
from runtime.pools import NULL, Pool
from runtime.prefix_cache import NO_HIT, Hit, PrefixCache
from runtime.request import Request, RequestStatus
from runtime.schedule import ScheduledRequest


class RowSlots:
    """Slots of rows and prefix-cache bookkeeping for one scheduler's pools."""

    def __init__(self, config: EngineConfig, block_pool: Pool, slot_pool: Pool,
                 prefix_cache: PrefixCache | None, *, uses_slots: bool) -> None:  # fmt: skip
        self.config = config
        self.block_pool = block_pool
        self.slot_pool = slot_pool
        self.prefix_cache = prefix_cache
        self.uses_slots = uses_slots
        # "all" mode: a decode step ending on a state block boundary writes its state to the cache,
        # keyed by the tokens it summarises.
        self._caches_decode_states = prefix_cache is not None and config.prefix_caching == "all"

    def free_for_lanes(self) -> int:
        """Free state slots less what the prefix cache's state budget may still take."""
        cache = self.prefix_cache
        return self.slot_pool.num_free - (cache.unused_state_budget if cache is not None else 0)

    def keep_lane(self, item: ScheduledRequest, lane: int) -> None:
        """After verification: the state after `lane` becomes the request's; its old slot and the
        other lanes go back. In "all" mode the accepted lanes (0..lane) that end on a state block
        boundary first give their slot to the prefix cache (runtime/scheduler.py, step 5)."""
        if not self.uses_slots:
            return
        request, lanes = item.request, item.lane_slots
        if self.config.prefix_caching == "all":
            sbs = self.config.state_block_size
            for t in range(lane + 1):
                end = item.start + t + 1  # tokens summarised by lane t's state
                if end % sbs == 0 and end <= request.num_tokens:
                    key = self.prefix_cache.state_key(request, end)
                    self.prefix_cache.adopt_state(key, lanes[t])
        old, request.state_slot = request.state_slot, lanes[lane]
        self.slot_pool.free([old, *lanes[:lane], *lanes[lane + 1 :]])

    def take_hit(self, request: Request) -> Hit:
        """Start a waiting request after its longest cached prefix, holding references on it."""
        if self.prefix_cache is None:
            return NO_HIT
        hit = self.prefix_cache.lookup(request)
        if hit.num_tokens:
            self.prefix_cache.acquire(hit)
            request.num_computed = hit.num_tokens
            request.block_ids = list(hit.block_ids)
            request.num_cached_blocks = len(hit.block_ids)
            request.read_slot = hit.slot
        return hit

    def drop_hit(self, request: Request, hit: Hit) -> None:
        """Undo `_take_hit` for a request that is not admitted after all."""
        if not hit.num_tokens:
            return
        self.block_pool.free(hit.block_ids)
        self.slot_pool.free([hit.slot] if hit.slot else [])
        request.num_computed = request.num_cached_blocks = 0
        request.block_ids, request.read_slot = [], NULL

    def decode_row(self, request: Request) -> ScheduledRequest:
        """A one-token decode row with its slots, built in one go (the per-row hot path of a
        decode step; `assign` gives the same item)."""
        start = request.num_computed
        if not self.uses_slots:
            return ScheduledRequest(request, start, 1)
        if self._caches_decode_states and (start + 1) % self.config.state_block_size == 0:
            return self.assign(ScheduledRequest(request, start, 1), decode=True)
        slot = request.state_slot
        return ScheduledRequest(request, start, 1, request.read_slot or slot, slot)

    def assign(self, item: ScheduledRequest, *, decode: bool) -> ScheduledRequest:
        """The item with the state slots its row reads and writes, and the boundary states it
        writes for the prefix cache (slots reserved now, published after the step)."""
        request = item.request
        if not self.uses_slots:
            return item
        read = (request.read_slot or request.state_slot) if item.start else NULL
        if item.lane_slots:  # speculative: lanes write fresh slots, the cache adopts after
            return item._replace(read_slot=read)
        item = item._replace(read_slot=read, write_slot=request.state_slot)
        if self.prefix_cache is None:
            return item
        sbs, end = self.config.state_block_size, item.start + item.num_tokens
        if decode:  # "all": a decode step ending on a boundary writes its state to the cache
            if not self._caches_decode_states or end % sbs:
                return item
            if request.num_pending:  # asynchronous: the token it feeds is still on the device
                key, slot = None, self.prefix_cache.reserve_unkeyed_state()
            else:
                key = self.prefix_cache.state_key(request, end)
                slot = self.prefix_cache.reserve_state(key)
            return item._replace(write_slot=slot, new_states=((key, slot),)) if slot else item
        first, last = item.start // sbs + 1, end // sbs  # boundaries crossed: first * sbs, ...
        wanted = range(first, last + 1)
        if self.config.prefix_caching == "align":  # only a chunk end on a boundary
            wanted = range(last, last + 1) if end % sbs == 0 else range(0)
        columns, new = [NULL] * max(last - first + 1, 0), []
        for boundary in wanted:
            key = self.prefix_cache.state_key(request, boundary * sbs)
            slot = self.prefix_cache.reserve_state(key)
            if slot:
                columns[boundary - first] = slot
                new.append((key, slot))
        return item._replace(boundary_slots=tuple(columns), new_states=tuple(new))

    def advance(self, item: ScheduledRequest) -> None:
        """Once the row's step is dispatched: the request stops reading the cached slot the row
        read (dropping its reference); a decode that wrote its state to a cache slot reads it
        next step (holding a reference), with no copy. Device order keeps this safe before the
        step has run: a slot given back now is reused only by a later step."""
        request = item.request
        if request.read_slot and item.read_slot == request.read_slot:
            self.slot_pool.free([request.read_slot])
            request.read_slot = NULL
        if item.write_slot and item.write_slot != request.state_slot:
            self.slot_pool.share([item.write_slot])
            request.read_slot = item.write_slot

    def publish(self, item: ScheduledRequest) -> None:
        """After the step ran: publish the states it wrote and the KV blocks it filled. An
        unkeyed state (key None) is keyed now by the tokens it summarises, known once the step
        before has retired (unknown only for a request aborted with its token pending)."""
        request, end = item.request, item.start + item.num_tokens
        for key, slot in item.new_states:
            if key is not None:
                self.prefix_cache.publish_state(key)
            else:
                known = request.num_tokens >= end
                self.prefix_cache.key_state(
                    slot, self.prefix_cache.state_key(request, end) if known else None
                )
        if request.status is RequestStatus.RUNNING:  # else it holds no blocks any more
            self.prefix_cache.publish_blocks(request)
