"""`RowsInFlight`: a rank's dispatched rows that were scheduled on drafts not verified yet.

An asynchronous MTP engine schedules step N + 1 while N runs, as if N's rows accept every
draft (docs/architecture.md section 4, "Drafting steps chain"). When N rejects the last d drafts
of a request's row, that request's row in N + 1 starts d tokens past the truth. It then either

- chains (`chained`, decided when it is scheduled): the device moves it back by d
  (`runtime/device/chaining.py`) and `moved_back` moves the host's copy of it the same way, so
  its tokens, slots and prefix-cache publication follow the row as it ran; or
- is stale (`mark_stale`): its tokens are dropped when it retires, and the request's next row is
  built from the truth.

Rows of both kinds are keyed by (request, start as scheduled) from `Scheduler.advance` to
`Scheduler.retire` (`retiring`).
"""

from __future__ import annotations

from runtime.core.request import Request
from runtime.core.schedule import Schedule, ScheduledRequest
from runtime.core.slots import SlotPlanner


class RowsInFlight:
    """Which dispatched rows moved back and which are stale, for one rank (module docstring)."""

    def __init__(self, slots: SlotPlanner) -> None:
        self.slots = slots
        self._stale: set[tuple[Request, int]] = set()
        self._moved: dict[tuple[Request, int], ScheduledRequest] = {}

    def chained(self, row: ScheduledRequest) -> ScheduledRequest:
        """`row` that may move back by the drafts its request's row in flight rejects
        (`ScheduledRequest.chained_lanes`): not when it writes a state for the prefix cache
        (keyed by where it ends), nor while a lane could still be short of `min_tokens` were
        every draft rejected (its masks follow the output count)."""
        lanes = self.slots.lanes_in_flight(row.request)
        if len(lanes) < 2 or row.new_states:
            return row
        request = row.request
        if request.num_sampled - (len(lanes) - 1) < request.sampling_params.min_tokens:
            return row
        return row._replace(chained_lanes=lanes)

    def moved_back(self, item: ScheduledRequest) -> ScheduledRequest:
        """A chained row whose previous row rejected drafts, as the device runs it: from the
        request's verified position, reading (a one-token row: writing in place) the slot of the
        lane verification kept. Call it once that previous row has retired."""
        request = item.request
        slot = self.slots.read_slot(request)
        moved = item._replace(
            start=request.num_computed,
            read_slot=slot,
            write_slot=item.write_slot and slot,  # in place; NULL for a row with drafts
        )
        self._moved[(request, item.start)] = moved
        return moved

    def mark_stale(self, item: ScheduledRequest) -> None:
        """`item` could not move back: its tokens are dropped when it retires."""
        self._stale.add((item.request, item.start))

    def is_stale(self, item: ScheduledRequest) -> bool:
        """Whether a dispatched row is stale (`mark_stale`); True only until it retires."""
        return (item.request, item.start) in self._stale

    def stale_decodes(self, schedule: Schedule) -> list[bool]:
        """`is_stale` of each decode row of a dispatched schedule; empty when no row in flight is
        stale (every step without chained drafts: no per-row work)."""
        return [self.is_stale(item) for item in schedule.decodes] if self._stale else []

    def retiring(self, item: ScheduledRequest) -> tuple[ScheduledRequest, bool]:
        """The row as it ran (moved back or as scheduled) and whether it is stale; forgotten
        after this."""
        key = (item.request, item.start)
        stale = key in self._stale
        self._stale.discard(key)
        return self._moved.pop(key, item), stale
