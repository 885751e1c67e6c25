"""`Schedule` and `ScheduledRequest`: the scheduler's decision for one step, as values (no jax).

The builder turns a `Schedule` into a step's padded inputs; the scheduler's `postprocess` reads
it back after the step has run. runtime/scheduler.py says how a schedule is made.
"""

from __future__ import annotations

import dataclasses
from typing import NamedTuple

from runtime.pools import NULL
from runtime.request import Request


class ScheduledRequest(NamedTuple):
    """One request's share of a step: tokens [start, start + num_tokens) of prompt + output.

    A NamedTuple rather than a frozen dataclass: one is built per running request per step, and a
    frozen dataclass's constructor costs several times more.

    Attributes (state slots, NULL without recurrent layers):
      read_slot: the slot holding the state before `start` (NULL for a first chunk).
      write_slot: the slot receiving the state after the last token (the request's own slot, or
        a fresh cache slot when a decode step ends on a state block boundary in "all" mode).
      boundary_slots: (prefill) slot of the j-th state block boundary after `start`, NULL where
        none is cached; the layout of the kernels' `boundary_slots` columns.
      new_states: (key, slot) of every state this step writes for the cache, published when the
        step retires (`Scheduler.retire`); key None: an asynchronous decode step whose token was
        still on the device when it was scheduled, keyed when it retires.
      lane_slots: (speculative decode) the fresh slot each of its num_tokens lanes writes (the
        state after each token; empty without speculation: the row writes `write_slot`). Its
        tokens past prompt + output are the request's drafts.
    """

    request: Request
    start: int
    num_tokens: int
    read_slot: int = NULL
    write_slot: int = NULL
    boundary_slots: tuple[int, ...] = ()
    new_states: tuple[tuple[bytes | None, int], ...] = ()
    lane_slots: tuple[int, ...] = ()

    @property
    def token_ids(self) -> list[int]:
        tokens = self.request.token_ids(self.start, self.start + self.num_tokens)
        return tokens + self.request.draft_token_ids[: self.num_tokens - len(tokens)]


@dataclasses.dataclass(frozen=True)
class Schedule:
    """The scheduler's decision for one step, classified by meaning: decode rows, prefill rows."""

    decodes: list[ScheduledRequest]
    prefills: list[ScheduledRequest]
    preempted: list[Request]

    @property
    def items(self) -> list[ScheduledRequest]:
        return self.decodes + self.prefills

    @property
    def is_empty(self) -> bool:
        return not self.decodes and not self.prefills

    @property
    def num_prefill_tokens(self) -> int:
        return sum(s.num_tokens for s in self.prefills)
