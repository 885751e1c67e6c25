"""`MTPDrafter`: the host side of drafting with the model's multi-token-prediction head.

The head runs inside the target's step (`runtime.device.mtp_drafts`): after a step, each row that
drafted has up to K drafts on the host, computed from the token the step just sampled. They are
that request's proposal for its next decode row: `num_wanted` is how many it has, `propose` hands
them to the rows the scheduler gave lanes. Nothing runs here, and nothing is compiled apart from
the target's steps.
"""

from __future__ import annotations

import numpy as np

from runtime.core.buckets import Bucket
from runtime.core.request import Request
from runtime.core.sampling_params import SamplingParams
from runtime.core.schedule import Schedule
from runtime.core.speculative_config import SpeculativeConfig
from runtime.speculative.verify import check_verifiable, with_drafts


class MTPDrafter:
    """Keeps each request's drafts from the step that last ran it (module docstring)."""

    total_compile_seconds = 0.0  # drafting is compiled into the target's steps

    def __init__(self, config: SpeculativeConfig) -> None:
        self.config = config
        self._proposals: dict[Request, list[int]] = {}

    def check(self, params: SamplingParams) -> None:
        check_verifiable(params)

    def num_wanted(self, request: Request) -> int:
        return len(self._proposals.get(request, ()))

    def propose(self, schedules: list[Schedule], bucket: Bucket) -> list[Schedule]:
        """Each row of 1 + k lanes feeds the first k drafts its request got last step."""
        return [with_drafts(schedule, self._proposals) for schedule in schedules]

    def observe(self, schedule: Schedule, bucket: Bucket, drafts: np.ndarray | None) -> None:
        """One rank's retired step of `bucket`: `drafts` [1 + K, N] (`runtime.device.mtp_drafts`)
        holds each scheduled row's count and drafts at its first logits row; None from a step
        that did not draft, whose rows' older drafts no longer follow their tokens."""
        if drafts is None:
            for item in schedule.items:
                self._proposals.pop(item.request, None)
            return
        width, num_decodes = bucket.width, len(schedule.decodes)
        first_prefill = bucket.num_decode_rows * width
        for i, item in enumerate(schedule.items):
            column = i * width if i < num_decodes else first_prefill + i - num_decodes
            count = int(drafts[0, column])
            if count:
                self._proposals[item.request] = drafts[1 : 1 + count, column].tolist()
            else:
                self._proposals.pop(item.request, None)

    def release_done(self) -> None:
        """Forget the drafts of requests that finished."""
        self._proposals = {r: d for r, d in self._proposals.items() if not r.is_finished}

    def warmup(self) -> None:
        """Compiles nothing of its own."""
