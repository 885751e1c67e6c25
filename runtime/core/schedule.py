"""`Schedule` and `ScheduledRequest`: the scheduler's decision for one step, as values (no jax).

The builder turns a `Schedule` into a step's padded inputs; the scheduler's `retire` reads it back
after the step has run. runtime/core/scheduler.py says how a schedule is made. Both are the
target's instances of two generic types, `StepSchedule[S]` and `ScheduledRow[S]`, whose rows feed
a sequence S: a `Request`, or a drafter's own view of one (a draft model's `DraftSequence`), which
the builder reads through `RowSequence`.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, NamedTuple, Protocol, TypeAlias

from runtime.core.penalties import PenaltyHistory
from runtime.core.pools import NULL
from runtime.core.request import Request, SamplingRow
from runtime.core.sampling_params import SamplingParams

if TYPE_CHECKING:
    from runtime.core.token_grammar import TokenGrammar


class RowSequence(Protocol):
    """What the builder reads of the sequence a row feeds: a `Request`, or a drafter's own view
    of one (`runtime.speculative.draft_sequences.DraftSequence`).

    Attributes:
      block_ids: its KV blocks, in position order.
      seed / sampling_params / sampling_row: how its tokens are sampled (`sampling_row`: the
        builder's fixed per-row values, `runtime.core.request.sampling_row`).
      stop_ids: the tokens that end it (masked while it is short of min_tokens).
      penalty_history / output_token_ids: the tokens its penalties count (None: not penalized)
        and the outputs it has on the host.
      pending_row: the logits row of the previous step holding its pending token (asynchronous
        scheduling).
      grammar: the matcher filling its rows of the allowed-token bitmask (None: unconstrained).
    """

    block_ids: list[int]
    seed: int
    sampling_params: SamplingParams
    sampling_row: SamplingRow[float]
    stop_ids: tuple[int, ...]
    pending_row: int

    @property
    def penalty_history(self) -> PenaltyHistory | None: ...

    @property
    def grammar(self) -> TokenGrammar | None: ...

    @property
    def output_token_ids(self) -> list[int]: ...

    @property
    def num_tokens(self) -> int: ...

    @property
    def num_sampled(self) -> int: ...

    @property
    def masked_token_ids(self) -> tuple[int, ...]: ...

    def token_at(self, index: int) -> int: ...

    def token_ids(self, start: int, stop: int) -> list[int]: ...


class ScheduledRow[S: RowSequence](NamedTuple):
    """One sequence's share of a step: tokens [start, start + num_tokens) of prompt + output, then
    its drafts.

    A NamedTuple rather than a frozen dataclass: one is built per running request per step, and a
    frozen dataclass's constructor costs several times more.

    Attributes (state slots are NULL for a model without recurrent layers):
      request: the sequence the row feeds (`ScheduledRequest`: the `Request`).
      read_slot: the slot holding the state before `start` (NULL for a first chunk).
      write_slot: the slot receiving the state after the last token (the request's own slot, or
        a fresh cache slot when a decode step ends on a state block boundary in "all" mode);
        NULL for a row with drafts, whose lanes write `lane_slots`.
      boundary_slots: (prefill) slot of the j-th state block boundary after `start`, NULL where
        none is cached; the layout of the kernels' `boundary_slots` columns.
      new_states: (key, slot) of every state this row writes for the prefix cache, published when
        the step retires; key None: an asynchronous decode step whose token was still on the
        device when it was scheduled, keyed when it retires. Keys are the cache's own business.
      lane_slots: (decode row with drafts) the fresh slot each of its num_tokens lanes writes
        (the state after each token; verification keeps one, the others go back). Empty for a
        row without drafts, which writes `write_slot`.
      draft_token_ids: the drafts its lanes feed after the request's last token (num_tokens - 1
        of them once the drafter has proposed; output only once verified).
      draft_sources: drafts still on the device instead (an asynchronous step drafting with the
        MTP head): per draft lane, the entry of the previous step's carried array it takes
        (s + 1, as `StepBatch.token_sources`); its lanes' token ids are then 0.
      chained_lanes: (decode row of an asynchronous drafting engine) the lane slots of the
        request's row in flight, when this row may start back by the drafts that row rejects:
        the device then reads (a one-token row: also writes in place) the slot of the last
        accepted lane, and moves the row's positions back (docs/architecture.md section 4,
        "Drafting steps chain"). Empty: the row starts where it was scheduled, and is stale if
        that row rejects a draft (`runtime.core.in_flight`).
    """

    request: S
    start: int
    num_tokens: int
    read_slot: int = NULL
    write_slot: int = NULL
    boundary_slots: tuple[int, ...] = ()
    new_states: tuple[tuple[bytes | None, int], ...] = ()
    lane_slots: tuple[int, ...] = ()
    draft_token_ids: tuple[int, ...] = ()
    draft_sources: tuple[int, ...] = ()
    chained_lanes: tuple[int, ...] = ()

    @property
    def token_ids(self) -> list[int]:
        tokens = self.request.token_ids(self.start, self.start + self.num_tokens)
        return tokens + list(self.draft_token_ids[: self.num_tokens - len(tokens)])


if TYPE_CHECKING:
    ScheduledRequest: TypeAlias = ScheduledRow[Request]  # noqa: UP040 (an alias that constructs)
else:  # the class itself: built through the subscripted alias, a row took 1.9 us, not 0.8
    ScheduledRequest = ScheduledRow


@dataclasses.dataclass(frozen=True)
class StepSchedule[S: RowSequence]:
    """A decision for one step, classified by meaning: decode rows, prefill rows (of sequences
    S), and the requests preempted to make room."""

    decodes: list[ScheduledRow[S]]
    prefills: list[ScheduledRow[S]]
    preempted: list[Request]

    @property
    def items(self) -> list[ScheduledRow[S]]:
        return self.decodes + self.prefills

    @property
    def is_empty(self) -> bool:
        return not self.decodes and not self.prefills

    @property
    def num_prefill_tokens(self) -> int:
        return sum(s.num_tokens for s in self.prefills)


if TYPE_CHECKING:
    Schedule: TypeAlias = StepSchedule[Request]  # noqa: UP040 (an alias that constructs)
else:
    Schedule = StepSchedule
