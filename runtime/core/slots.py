"""`SlotPlanner`: the seam between the scheduler and prefix caching, with what crosses it (a
`Hit`, a planner's `PrefixCacheStats`); `PlainSlots`: no caching.

A slot planner keeps one rank's pools (KV blocks and recurrent-state slots) and decides, for each
scheduled row, which state slot it reads and which it writes. The scheduler decides which rows
run and how many tokens each; it then asks its planner, unconditionally, for the entries they
hold. Two planners exist:

- `PlainSlots` (here): a request reads and writes its own state slot, nothing is cached;
- `runtime.prefix_cache.CachingSlots`: a request may start after a cached prefix, read a cached
  state, and write states at block boundaries for later requests.

The engine picks one per rank (`runtime.prefix_cache.slot_planner`), so neither the scheduler nor
the builder asks whether caching is on. A model without recurrent layers holds no state slots and
one without attention no KV blocks (`uses_slots` / `uses_blocks`, the model's capabilities): their
rows carry NULL.
"""

from __future__ import annotations

import dataclasses
import sys
from typing import NamedTuple, Protocol

import numpy as np

from runtime.core.config import EngineConfig
from runtime.core.pools import NULL, Pool
from runtime.core.request import Request
from runtime.core.schedule import ScheduledRequest

_NONE = np.zeros(0, np.int32)


class Hit(NamedTuple):
    """A cached prefix a request starts after: its first `num_tokens` tokens' KV blocks and the
    state after them (`SlotPlanner.take_hit`; `NO_HIT` where nothing is cached).

    Attributes:
      num_tokens: p, a multiple of state_block_size (0: no hit).
      block_ids: the cached KV blocks of [0, p) (empty for a model without attention).
      slot: the state slot holding the state after p tokens (NULL for a model without
        recurrent layers).
    """

    num_tokens: int
    block_ids: list[int]
    slot: int


NO_HIT = Hit(0, [], NULL)


@dataclasses.dataclass
class PrefixCacheStats:
    """Counters of one rank's prefix cache (`runtime.prefix_cache`; `SlotPlanner.stats`).

    Attributes:
      lookups / lookup_tokens: admissions (first ones and re-admissions after preemption) and
        their prefill tokens.
      hits / hit_tokens: admissions that started past token 0, and the tokens they skipped.
      blocks_published / states_published: entries added.
      block_evictions / state_evictions: entries dropped to make room.
    """

    lookups: int = 0
    lookup_tokens: int = 0
    hits: int = 0
    hit_tokens: int = 0
    blocks_published: int = 0
    states_published: int = 0
    block_evictions: int = 0
    state_evictions: int = 0

    @classmethod
    def total(cls, parts: list[PrefixCacheStats]) -> PrefixCacheStats:
        """Every counter summed over `parts` (the ranks of an engine)."""
        names = [field.name for field in dataclasses.fields(cls)]
        return cls(**{name: sum(getattr(part, name) for part in parts) for name in names})

    @property
    def token_hit_rate(self) -> float:
        """Share of looked-up prefill tokens that a hit skipped."""
        return self.hit_tokens / self.lookup_tokens if self.lookup_tokens else 0.0


class SlotPlanner(Protocol):
    """What the scheduler asks of a rank's pools and slot policy (see the module docstring).

    Attributes:
      block_pool / slot_pool: the rank's KV block and state-slot pools (slot and block 0: NULL).
      uses_blocks / uses_slots: whether the model has attention / recurrent layers.
      stats: the prefix cache's counters, None for a planner that caches nothing.
    """

    block_pool: Pool
    slot_pool: Pool
    uses_blocks: bool
    uses_slots: bool
    stats: PrefixCacheStats | None

    # Admission: the prefix a waiting request may start after.
    def take_hit(self, request: Request) -> Hit:
        """Start `request` after its longest cached prefix (its `num_computed` and `block_ids`
        then cover it; references held); returns the hit (`NO_HIT`: none), which the scheduler
        does not read: it hands it back to `drop_hit` or `admitted`."""

    def drop_hit(self, request: Request, hit: Hit) -> None:
        """Undo `take_hit` for a request that is not admitted after all."""

    def admitted(self, request: Request, hit: Hit) -> None:
        """`request` was admitted after `hit`: count the lookup, mark the hit recently used."""

    # Pool entries.
    def can_allocate_blocks(self, n: int) -> bool: ...

    def allocate_blocks(self, n: int) -> list[int]: ...

    def can_start(self) -> bool:
        """Whether a request can be admitted now (a state slot for it)."""

    def start(self, request: Request) -> None:
        """Give an admitted request its own state slot."""

    def free_for_lanes(self) -> int:
        """State slots that draft lanes may take now."""

    def lane_slots(self, n: int) -> tuple[int, ...]:
        """n fresh slots for the lanes of a decode row with drafts."""

    def release(self, request: Request) -> None:
        """Give back every block and slot `request` holds (it finished or was preempted)."""

    def read_slot(self, request: Request) -> int:
        """The slot holding the request's state after its computed tokens."""

    # Rows.
    def decode_row(self, request: Request) -> ScheduledRequest:
        """A one-token decode row with the slots it reads and writes."""

    def draft_row(self, request: Request, lanes: tuple[int, ...]) -> ScheduledRequest:
        """A decode row with len(lanes) - 1 drafts, each lane writing its own fresh slot."""

    def prefill_row(self, item: ScheduledRequest) -> ScheduledRequest:
        """A prefill chunk with the slots it reads and writes and the boundary states it writes."""

    # After the step.
    def advance(self, item: ScheduledRequest) -> None:
        """The row's step is dispatched: move the request's slot bookkeeping past it (a row with
        drafts as if every draft will be accepted: its last lane's slot is what the request's
        next row reads, until `keep_lane`)."""

    def lanes_in_flight(self, request: Request) -> tuple[int, ...]:
        """The lane slots of the request's dispatched row with drafts, until `keep_lane`; empty
        when it has none."""

    def keep_lane(self, item: ScheduledRequest, lane: int) -> None:
        """Verification kept lane `lane` of a row with drafts: its state becomes the request's."""

    def drop_lanes(self, item: ScheduledRequest) -> None:
        """A row with drafts whose tokens are not kept (its request finished, was preempted, or
        the row was scheduled on drafts its previous step rejected): its lane slots go back."""

    def retired(self, item: ScheduledRequest) -> None:
        """The row's step has run and its tokens are appended: publish what it wrote."""

    def end_step(self) -> None:
        """Every row of the step has retired (the cache's events of the step go out)."""

    # What no step may write (`check_step_inputs`).
    @property
    def published_slots(self) -> np.ndarray: ...

    @property
    def published_blocks(self) -> np.ndarray: ...


class PlainSlots:
    """A request reads and writes its own state slot; nothing is cached (prefix caching "off")."""

    stats: PrefixCacheStats | None = None

    def __init__(self, config: EngineConfig, *, uses_blocks: bool, uses_slots: bool) -> None:
        self.config = config
        self.uses_blocks = uses_blocks
        self.uses_slots = uses_slots
        self.block_pool = Pool("KV block", config.num_blocks)
        self.slot_pool = Pool("state slot", config.num_slots)
        # The lane slots of a dispatched row with drafts, per request, until verification keeps
        # a lane: the request's next row reads the last (or, chained, the last accepted one:
        # `ScheduledRequest.chained_lanes`), and a one-token row writes that lane in place
        # (those requests are in `_overwritten`: the kept lane's state is then not the cache's
        # to take, `CachingSlots.keep_lane`).
        self._in_flight: dict[Request, tuple[int, ...]] = {}
        self._overwritten: set[Request] = set()

    def take_hit(self, request: Request) -> Hit:
        """Nothing is cached: every request starts at token 0."""
        return NO_HIT

    def drop_hit(self, request: Request, hit: Hit) -> None:
        """Nothing was taken."""

    def admitted(self, request: Request, hit: Hit) -> None:
        """Nothing to count."""

    def can_allocate_blocks(self, n: int) -> bool:
        return self.block_pool.can_allocate(n)

    def allocate_blocks(self, n: int) -> list[int]:
        return self.block_pool.allocate(n)

    def can_start(self) -> bool:
        return not self.uses_slots or self.slot_pool.can_allocate(1)

    def start(self, request: Request) -> None:
        if self.uses_slots:
            request.state_slot = self.slot_pool.allocate(1)[0]

    def free_for_lanes(self) -> int:
        return self.slot_pool.num_free if self.uses_slots else sys.maxsize

    def lane_slots(self, n: int) -> tuple[int, ...]:
        return tuple(self.slot_pool.allocate(n)) if self.uses_slots else (NULL,) * n

    def release(self, request: Request) -> None:
        self.block_pool.free(request.block_ids)
        if request.state_slot:
            self.slot_pool.free([request.state_slot])
        request.block_ids, request.state_slot = [], NULL
        self._in_flight.pop(request, None)  # the row that holds them gives them back (`drop_lanes`)
        self._overwritten.discard(request)

    def read_slot(self, request: Request) -> int:
        """The slot holding the request's state after its computed tokens."""
        return self.own_slot(request)

    def own_slot(self, request: Request) -> int:
        """The slot a one-token row of the request writes: its own, or the last lane of its
        dispatched row with drafts (in place)."""
        lanes = self._in_flight.get(request)
        return lanes[-1] if lanes else request.state_slot

    def lanes_in_flight(self, request: Request) -> tuple[int, ...]:
        return self._in_flight.get(request, ())

    def decode_row(self, request: Request) -> ScheduledRequest:
        slot = self.own_slot(request)
        if request in self._in_flight:
            self._overwritten.add(request)
        return ScheduledRequest(request, request.num_computed, 1, self.read_slot(request), slot)

    def draft_row(self, request: Request, lanes: tuple[int, ...]) -> ScheduledRequest:
        return ScheduledRequest(
            request, request.num_computed, len(lanes), self.read_slot(request), lane_slots=lanes
        )

    def prefill_row(self, item: ScheduledRequest) -> ScheduledRequest:
        request = item.request
        read = self.read_slot(request) if item.start else NULL  # a first chunk starts from zeros
        return item._replace(read_slot=read, write_slot=request.state_slot)

    def advance(self, item: ScheduledRequest) -> None:
        """A one-token row: nothing moves (the request's slot holds its state before and after).
        A row with drafts: its last lane's slot is what the next row reads, until `keep_lane`."""
        if item.lane_slots:
            self._in_flight[item.request] = item.lane_slots

    def keep_lane(self, item: ScheduledRequest, lane: int) -> None:
        """The state after `lane` becomes the request's; its old slot and the other lanes go
        back (rollback by slot choice: no copy). A row dispatched after this one read the last
        lane, or (chained) this one: the device runs it before any later step that reuses a
        slot given back here."""
        self._verified(item.request)
        if not self.uses_slots:
            return
        request, lanes = item.request, item.lane_slots
        old, request.state_slot = request.state_slot, lanes[lane]
        self.slot_pool.free([old, *lanes[:lane], *lanes[lane + 1 :]])

    def _verified(self, request: Request) -> bool:
        """The request's row in flight was verified: forget its lanes. Returns whether a
        one-token row dispatched after it writes the kept lane in place (`decode_row`)."""
        self._in_flight.pop(request, None)
        overwritten = request in self._overwritten
        self._overwritten.discard(request)
        return overwritten

    def drop_lanes(self, item: ScheduledRequest) -> None:
        if self.uses_slots and item.lane_slots:
            self.slot_pool.free(list(item.lane_slots))

    def retired(self, item: ScheduledRequest) -> None:
        """Nothing to publish."""

    def end_step(self) -> None:
        """No events."""

    @property
    def published_slots(self) -> np.ndarray:
        return _NONE

    @property
    def published_blocks(self) -> np.ndarray:
        return _NONE
