"""`MTPDrafter`: the host side of drafting with the model's multi-token-prediction head.

The head runs inside the target's step (`runtime.device.mtp_drafts`): each row that samples
drafts up to K tokens from the token the step just sampled. They are that request's proposal for
its next decode row, in one of two places:

- on the device, while the step that made them is in flight (an asynchronous engine schedules
  the next step before it retires): the next row's draft lanes take them from the step's carried
  array (`ScheduledRequest.draft_sources`), as its first lane takes the pending token;
- on the host, once the step retired (`observe`): a synchronous engine's next step, and the row
  after a stale one (`RowsInFlight.is_stale`: scheduled on drafts the step before then
  rejected, and not moved back), feed them as token ids.

`num_wanted` is how many it has (K on the device: how many the chain made is known only there; a
lane fed a draft the chain did not make carries an arbitrary token, which verification accepts
only if the target samples it). Nothing runs here, and nothing is compiled apart from the
target's steps.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from runtime.core.buckets import Bucket
from runtime.core.request import Request
from runtime.core.sampling_params import SamplingParams
from runtime.core.schedule import Schedule, ScheduledRequest
from runtime.core.speculative_config import SpeculativeConfig
from runtime.speculative.verify import check_verifiable


class MTPDrafter:
    """Keeps each request's drafts from the step that last ran it (module docstring).

    `carried_width`: C, the logits rows a step carries to the next (`carried_tokens`): draft j
    of the row whose first logits row is c is carried entry j * C + c."""

    total_compile_seconds = 0.0  # drafting is compiled into the target's steps

    def __init__(self, config: SpeculativeConfig, carried_width: int) -> None:
        self.config = config
        self._width = carried_width
        self._proposals: dict[Request, list[int]] = {}  # retired steps' drafts
        self._on_device: dict[Request, tuple[int, ...]] = {}  # the in-flight step's: sources
        self._moved: set[tuple[Request, int]] = set()  # rows whose drafts `observe` keeps

    def check(self, params: SamplingParams) -> None:
        check_verifiable(params)

    def num_wanted(self, request: Request) -> int:
        on_device = self._on_device.get(request)
        return len(on_device) if on_device else len(self._proposals.get(request, ()))

    def propose(self, schedules: list[Schedule], bucket: Bucket) -> list[Schedule]:
        """Each row of 1 + k lanes feeds the first k drafts of its request: from the device
        when the step that made them is in flight, else their ids."""
        return [self._proposed(schedule) for schedule in schedules]

    def dispatched(
        self, schedule: Schedule, bucket: Bucket, moved: list[bool], drafted: bool
    ) -> None:
        """A drafting step's rows that moved on have drafts on the device for the next step. A
        step without drafts forgets every draft at once, with no per-row work: its rows' older
        drafts no longer follow their tokens, and a request it did not run drafts again from
        the next drafting step's head."""
        if not drafted:
            self._on_device.clear()
            self._proposals.clear()
            return
        k, width = self.config.num_speculative_tokens, self._width
        entries = tuple(j * width + 1 for j in range(1, 1 + k))  # draft j's, less the column
        for column, item, went in zip(
            first_logits_rows(schedule, bucket), schedule.items, moved, strict=True
        ):
            if went:
                self._moved.add((item.request, item.start))
                self._on_device[item.request] = tuple(column + entry for entry in entries)

    def observe(self, schedule: Schedule, bucket: Bucket, drafts: np.ndarray | None) -> None:
        """One rank's retired step of `bucket`: `drafts` [1 + K, N] (`runtime.device.mtp_drafts`)
        holds each scheduled row's count and drafts at its first logits row; None from a step
        that did not draft, whose `dispatched` forgot every draft already. The step's drafts
        are on the host now: the next step (scheduled after this) feeds them by id. A stale
        row's are not kept."""
        if drafts is None:
            return
        columns = drafts.T.tolist()  # [N][1 + K]: count, drafts
        for column, item in zip(first_logits_rows(schedule, bucket), schedule.items, strict=True):
            request = item.request
            self._on_device.pop(request, None)
            key = (request, item.start)
            if key not in self._moved:
                continue
            self._moved.remove(key)
            count = columns[column][0]
            if count:
                self._proposals[request] = columns[column][1 : 1 + count]
            else:
                self._proposals.pop(request, None)

    def release_done(self) -> None:
        """Forget the drafts of requests that finished."""
        self._proposals = {r: d for r, d in self._proposals.items() if not r.is_finished}
        self._on_device = {r: d for r, d in self._on_device.items() if not r.is_finished}

    def warmup(self) -> None:
        """Compiles nothing of its own."""

    def _proposed(self, schedule: Schedule) -> Schedule:
        decodes = [
            self._with_drafts(item) if item.lane_slots else item for item in schedule.decodes
        ]
        return dataclasses.replace(schedule, decodes=decodes)

    def _with_drafts(self, item: ScheduledRequest) -> ScheduledRequest:
        k = item.num_tokens - 1
        on_device = self._on_device.get(item.request)
        if on_device:
            return item._replace(draft_sources=on_device[:k])
        return item._replace(draft_token_ids=tuple(self._proposals[item.request][:k]))


def first_logits_rows(schedule: Schedule, bucket: Bucket) -> list[int]:
    """Each item's first logits row: decode row i's i * W, prefill row j's R_d * W + j."""
    width, num_decodes = bucket.width, len(schedule.decodes)
    first_prefill = bucket.num_decode_rows * width
    return [
        i * width if i < num_decodes else first_prefill + i - num_decodes
        for i in range(len(schedule.items))
    ]
