"""`PrefixCache`: one rank's cache of full KV blocks and recurrent states, keyed by token prefix.

Keys. Full KV blocks of block_size tokens are named by a chained digest, d_i = H(d_{i-1}, token
ids of block i) (blake2b over the int32 bytes: Python's `hash()` collides too easily for lossless
serving), so d_i names the whole prefix [0, (i + 1) * block_size). The recurrent state at position
p (p a multiple of state_block_size, itself a multiple of block_size) is keyed by the digest of
the KV block ending at p: the key names exactly the prefix the state summarises (vLLM #51113).
The two units are never mixed (vLLM #53142): block indices count block_size tokens, positions
count tokens.

Ownership. The cache holds one reference (`Pool.share`) on every block and state slot it names,
so a request freeing its own reference does not free a cached entry. An entry no request uses
(reference count 1) is evictable, least recently used first; eviction drops the cache's reference
(`Pool.free`). KV blocks are evicted when the block pool runs short; state slots have a budget of
their own, `max_cached_states`, counting published entries and slots reserved for states a step
is about to write.

Publication. A state slot is *reserved* when the scheduler gives a step a state to write there
and *published* only after that step has run (vLLM #56525): a reserved slot is never found by a
lookup. A published slot is only ever read (copy-on-write by construction: a request that hits
reads it and writes its own slot; vLLM #57253). KV blocks are published when full, after the step
that filled them; a block whose digest is already cached stays its request's own.

Events. Every publication and eviction is reported to `events`, the sink of
runtime/prefix_cache/events.py (a no-op one when events are off), so a KV-aware router can mirror
the published entries: KV blocks as group 0, states as group 1.

Host side only: numpy and hashlib, no jax.
"""

from __future__ import annotations

import collections
import hashlib
import types
import weakref
from collections.abc import Mapping

import numpy as np

from runtime.core.pools import NULL, Pool
from runtime.core.request import Request
from runtime.core.slots import NO_HIT, Hit, PrefixCacheStats
from runtime.prefix_cache.events import KV_GROUP, STATE_GROUP, CacheEvents

DIGEST_BYTES = 16


def chain_digest(previous: bytes, token_ids: list[int]) -> bytes:
    """The digest of a block: blake2b over the previous block's digest and this block's ids."""
    h = hashlib.blake2b(previous, digest_size=DIGEST_BYTES)
    h.update(np.asarray(token_ids, np.int32).tobytes())
    return h.digest()


class PrefixCache:
    """Digest -> KV block and digest -> state slot maps of one rank, in LRU order.

    `uses_blocks` / `uses_slots`: whether the model has attention / recurrent layers (a hit
    needs every KV block of its prefix cached, resp. the state at its end).
    """

    def __init__(
        self,
        block_pool: Pool,
        slot_pool: Pool,
        *,
        block_size: int,
        state_block_size: int,
        max_cached_states: int,
        uses_blocks: bool,
        uses_slots: bool,
        events: CacheEvents | None = None,
    ) -> None:
        """`events`: the sink publications and evictions are reported to (None: a no-op one)."""
        if state_block_size % block_size:
            raise ValueError(
                f"state_block_size={state_block_size} must be a multiple of block_size={block_size}"
            )
        self.block_pool, self.slot_pool = block_pool, slot_pool
        self.block_size, self.state_block_size = block_size, state_block_size
        self.max_cached_states = max_cached_states
        self.uses_blocks, self.uses_slots = uses_blocks, uses_slots
        self.stats = PrefixCacheStats()
        self.events = events or CacheEvents()
        # Least recently used first; a hit or a publication moves an entry to the end.
        self._blocks: collections.OrderedDict[bytes, int] = collections.OrderedDict()
        # Which blocks `_blocks` holds, by id: counting the evictable ones is then one vectorised
        # pass over the pool (`can_allocate_blocks` runs whenever a full pool must make room:
        # iterating the entries took 2.5 of 6.9 s of a 256-row bench run under cProfile).
        self._cached_blocks = np.zeros(block_pool.size, bool)
        self._states: collections.OrderedDict[bytes, int] = collections.OrderedDict()
        self._reserved: dict[bytes, int] = {}
        # Slots a step writes a state to whose key is known only when the step retires (an
        # asynchronous decode feeding a token still on the device): `key_state` settles them.
        self._unkeyed: set[int] = set()
        # Each live request's block digests (a function of its token ids alone, so they survive
        # preemption); an entry goes with its request.
        self._digests: weakref.WeakKeyDictionary[Request, list[bytes]] = weakref.WeakKeyDictionary()

    # ----------------------------------------------------------------------------- keys

    def digests(self, request: Request, num_blocks: int) -> list[bytes]:
        """The chained digests of the request's first `num_blocks` full blocks (memoised per
        request: they depend on its token ids only, which never change once known)."""
        known, bs = self._digests.setdefault(request, []), self.block_size
        previous = known[-1] if known else b""
        for i in range(len(known), num_blocks):
            previous = chain_digest(previous, request.token_ids(i * bs, (i + 1) * bs))
            known.append(previous)
        return known[:num_blocks]

    def state_key(self, request: Request, position: int) -> bytes:
        """The key of the request's state after `position` tokens (a state block boundary)."""
        return self.digests(request, position // self.block_size)[-1]

    # ----------------------------------------------------------------------------- lookup

    def lookup(self, request: Request) -> Hit:
        """The longest cached prefix of the request's tokens to prefill, at most all but the last
        one (a full-prompt hit still computes its last token for the logits)."""
        bs, per_state = self.block_size, self.state_block_size // self.block_size
        digests = self.digests(request, (request.num_prefill_tokens - 1) // bs)
        blocks: list[int] = []
        best = (0, NULL)
        for i, digest in enumerate(digests):
            if self.uses_blocks:
                block = self._blocks.get(digest)
                if block is None:
                    break  # a hit needs every KV block before it
                blocks.append(block)
            if (i + 1) % per_state:
                continue
            slot = self._states.get(digest, NULL)
            if slot or not self.uses_slots:
                best = (i + 1, slot)
        num_blocks, slot = best
        if num_blocks == 0:
            return NO_HIT
        return Hit(num_blocks * bs, blocks[:num_blocks] if self.uses_blocks else [], slot)

    def acquire(self, hit: Hit) -> None:
        """Take a request's reference on the hit's blocks and slot (they stop being evictable)."""
        self.block_pool.share(hit.block_ids)
        if hit.slot:
            self.slot_pool.share([hit.slot])

    def touch(self, request: Request, hit: Hit) -> None:
        """Mark the hit's entries most recently used and count the lookup in the stats. The last
        block is touched first, so within one prefix the deepest blocks are evicted first."""
        self.stats.lookups += 1
        self.stats.lookup_tokens += request.num_prefill_tokens
        if not hit.num_tokens:
            return
        self.stats.hits += 1
        self.stats.hit_tokens += hit.num_tokens
        digests = self.digests(request, hit.num_tokens // self.block_size)
        if self.uses_blocks:
            for digest in reversed(digests):
                self._blocks.move_to_end(digest)
        if hit.slot:
            self._states.move_to_end(digests[-1])

    # ----------------------------------------------------------------------------- KV blocks

    def can_allocate_blocks(self, n: int) -> bool:
        """Whether n blocks are free or can be freed by evicting unused cached blocks."""
        free = self.block_pool.num_free
        if n <= free:
            return True
        evictable = np.count_nonzero(self._cached_blocks & (self.block_pool.ref_counts == 1))
        return n <= free + int(evictable)

    def allocate_blocks(self, n: int) -> list[int]:
        """n blocks, evicting least recently used unused cached blocks while the pool is short."""
        while self.block_pool.num_free < n:
            key = self._evict_block()
            if key is None:
                break  # Pool.allocate raises with the numbers
            self.stats.block_evictions += 1
            self.events.removed(KV_GROUP, key)
        return self.block_pool.allocate(n)

    def publish_blocks(self, request: Request, num_offered: int) -> int:
        """Publish the request's blocks that its computed tokens have filled past its first
        `num_offered` (offered before); returns how many are offered now.

        Its whole cached prefix then becomes most recently used, deepest block first: within a
        prefix, deeper blocks are always older, so eviction never cuts a prefix in the middle
        (a block is useless without every block before it).
        """
        # Computed tokens may run past the known ones: a chain of decode steps feeds tokens the
        # host learns later (`EngineArgs.decode_steps`); a block is keyed by known tokens only.
        full = min(request.num_computed, request.num_tokens) // self.block_size
        if not self.uses_blocks or full <= num_offered:
            return max(full, num_offered)
        digests = self.digests(request, full)
        run = num_offered  # the first block of the run of blocks stored in a row
        for i in range(num_offered, full):
            if digests[i] in self._blocks:  # another request's copy is cached already
                self._report_blocks(request, run, i)
                run = i + 1
                continue
            block = request.block_ids[i]
            self.block_pool.share([block])
            self._blocks[digests[i]] = block
            self._cached_blocks[block] = True
            self.stats.blocks_published += 1
        self._report_blocks(request, run, full)
        for digest in reversed(digests):
            if digest in self._blocks:
                self._blocks.move_to_end(digest)
        return full

    # ----------------------------------------------------------------------------- states

    def has_state(self, key: bytes) -> bool:
        """Whether the state of `key` is published or reserved (then it is not written again)."""
        return key in self._states or key in self._reserved

    def reserve_state(self, key: bytes) -> int:
        """A fresh slot for the state of `key` that the next step writes, or NULL when the key is
        cached or reserved already, or every cached state is in use and the budget is spent."""
        if self.has_state(key):
            return NULL
        slot = self._take_state_slot()
        if slot:
            self._reserved[key] = slot
        return slot

    def reserve_unkeyed_state(self) -> int:
        """A fresh slot for a state the next step writes whose key is not known yet (its last
        token is still on the device), or NULL when every cached state is in use and the budget
        is spent. `key_state` publishes or drops it once the step has run."""
        slot = self._take_state_slot()
        if slot:
            self._unkeyed.add(slot)
        return slot

    def key_state(self, slot: int, key: bytes | None, request: Request) -> None:
        """Publish the unkeyed `slot` under `key` (its step has run and its tokens are known);
        drop the cache's reference instead when `key` is None (the tokens never became known: an
        abort) or is cached already."""
        self._unkeyed.remove(slot)
        if key is None or self.has_state(key):
            self.slot_pool.free([slot])
            return
        self._states[key] = slot
        self.stats.states_published += 1
        self._report_state(request, key)

    def adopt_state(self, key: bytes, slot: int, request: Request) -> bool:
        """Publish `slot`, which a step that has run wrote the state of `key` to (an accepted
        speculative lane), taking a reference on it; False (nothing taken) when the key is cached
        or reserved already, or every cached state is in use and the budget is spent."""
        if self.has_state(key) or not self._make_state_room():
            return False
        self.slot_pool.share([slot])
        self._states[key] = slot
        self.stats.states_published += 1
        self._report_state(request, key)
        return True

    @property
    def unused_state_budget(self) -> int:
        """State slots the cache may still take without evicting."""
        return max(self.max_cached_states - self.num_states, 0)

    def _take_state_slot(self) -> int:
        """A fresh slot within the state budget (evicting if needed), or NULL when none fits."""
        return self.slot_pool.allocate(1)[0] if self._make_state_room() else NULL

    def _make_state_room(self) -> bool:
        """Evict unused states, least recently used first, until one more fits the budget."""
        while self.num_states >= self.max_cached_states:
            key = self._evict_state()
            if key is None:
                return False
            self.stats.state_evictions += 1
            self.events.removed(STATE_GROUP, key)
        return True

    def publish_state(self, key: bytes, request: Request) -> int:
        """Publish the reserved state of `key`, a state of `request` (its step has run); returns
        its slot."""
        slot = self._reserved.pop(key)
        self._states[key] = slot
        self.stats.states_published += 1
        self._report_state(request, key)
        return slot

    @property
    def published_states(self) -> Mapping[bytes, int]:
        """Key -> slot of every published state (a read-only view)."""
        return types.MappingProxyType(self._states)

    @property
    def published_slots(self) -> np.ndarray:
        """[n] int32 state slots a lookup can return: no step may write them."""
        return np.fromiter(self._states.values(), np.int32, len(self._states))

    @property
    def published_blocks(self) -> np.ndarray:
        """[n] int32 KV blocks a lookup can return: no step may write them."""
        return np.fromiter(self._blocks.values(), np.int32, len(self._blocks))

    @property
    def num_states(self) -> int:
        """State slots the cache holds (published, reserved and unkeyed): at most
        max_cached_states."""
        return len(self._states) + len(self._reserved) + len(self._unkeyed)

    @property
    def block_digests(self) -> collections.abc.KeysView[bytes]:
        """The digests of every published KV block (a live view)."""
        return self._blocks.keys()

    def reset(self) -> None:
        """Evict every entry no request uses (reserved and unkeyed slots stay: a step is
        writing them). Reported as one AllBlocksCleared when nothing published is left, else as
        the entries evicted."""
        blocks, states = [], []
        while (key := self._evict_block()) is not None:
            self.stats.block_evictions += 1
            blocks.append(key)
        while (key := self._evict_state()) is not None:
            self.stats.state_evictions += 1
            states.append(key)
        if not self._blocks and not self._states:
            self.events.cleared()
            return
        for group, keys in ((KV_GROUP, blocks), (STATE_GROUP, states)):
            for key in keys:
                self.events.removed(group, key)

    # ----------------------------------------------------------------------------- events

    def _report_blocks(self, request: Request, first: int, stop: int) -> None:
        """Report the request's blocks first .. stop - 1 as stored (nothing when none)."""
        if first < stop:
            self.events.stored(KV_GROUP, self._digests[request], first, stop, request)

    def _report_state(self, request: Request, key: bytes) -> None:
        """Report the state of `key` as stored: the request's block ending where it is."""
        self.events.state_stored(self._digests[request], key, request)

    # ----------------------------------------------------------------------------- eviction

    def _evict_block(self) -> bytes | None:
        """Drop the least recently used block only the cache references; returns its digest,
        None if every block is in use."""
        evicted = self._evict(self._blocks, self.block_pool)
        if evicted is None:
            return None
        key, block = evicted
        self._cached_blocks[block] = False
        return key

    def _evict_state(self) -> bytes | None:
        """Drop the least recently used state only the cache references; returns its key, None
        if every state is in use."""
        evicted = self._evict(self._states, self.slot_pool)
        return None if evicted is None else evicted[0]

    @staticmethod
    def _evict(
        entries: collections.OrderedDict[bytes, int], pool: Pool
    ) -> tuple[bytes, int] | None:
        """Drop the least recently used entry only the cache references and free its id;
        returns (its key, its id), None if every entry is in use."""
        for key, ident in entries.items():
            if pool.ref_counts[ident] == 1:
                del entries[key]
                pool.free([ident])
                return key, ident
        return None
