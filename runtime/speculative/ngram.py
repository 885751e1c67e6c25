"""`NgramDrafter`: prompt-lookup drafts from the request's own tokens, on the host (numpy, no jax).

For n from `prompt_lookup_max` down to `prompt_lookup_min`: if the last n tokens of prompt +
output occurred earlier in them, propose the (up to K) tokens that followed their most recent
earlier occurrence. Text that repeats itself (code, quotes, lists, a chat that copies from its
prompt) gets drafts that often match; elsewhere nothing is proposed and the row decodes one token
through the same speculative path.
"""

from __future__ import annotations

import numpy as np

from runtime.core.buckets import Bucket
from runtime.core.request import Request
from runtime.core.sampling_params import SamplingParams
from runtime.core.schedule import Schedule
from runtime.core.speculative_config import SpeculativeConfig
from runtime.speculative.verify import check_verifiable, with_drafts


def lookup(tokens: np.ndarray, min_n: int, max_n: int, k: int) -> list[int]:
    """Up to k tokens that followed the most recent earlier occurrence of the longest suffix of
    `tokens` of length in [min_n, max_n]; [] when no such suffix occurred before.

    Runs per decode row per step on the host, so it starts from the few earlier positions of the
    last token and extends backwards, instead of comparing every window (6x faster at 576
    tokens)."""
    length = tokens.size
    if length < 2:
        return []
    last = length - 1
    ends = np.flatnonzero(tokens[:last] == tokens[last])  # where an earlier occurrence would end
    for n in range(min(max_n, last), min_n - 1, -1):
        found = ends[ends >= n - 1]
        for back in range(1, n):
            found = found[tokens[found - back] == tokens[last - back]]
        if found.size:
            start = int(found[-1]) + 1
            return tokens[start : start + k].tolist()
    return []


class NgramDrafter:
    """Drafts by prompt lookup. The lookup runs when the scheduler asks how many drafts a row
    wants; `propose` hands each row with lanes the first k tokens of its proposal."""

    total_compile_seconds = 0.0  # nothing runs on the device

    def __init__(self, config: SpeculativeConfig) -> None:
        self.config = config
        self._proposals: dict[Request, list[int]] = {}  # this step's lookups

    def check(self, params: SamplingParams) -> None:
        check_verifiable(params)

    def num_wanted(self, request: Request) -> int:
        """Look the request's tokens up; keep the proposal until `propose`."""
        c = self.config
        tokens = np.asarray(request.token_ids(0, request.num_tokens), np.int32)
        proposal = lookup(
            tokens, c.prompt_lookup_min, c.prompt_lookup_max, c.num_speculative_tokens
        )
        self._proposals[request] = proposal
        return len(proposal)

    def propose(self, schedules: list[Schedule], bucket: Bucket) -> list[Schedule]:
        """Nothing to run: each row of 1 + k lanes feeds the first k tokens of its proposal."""
        proposals, self._proposals = self._proposals, {}
        return [with_drafts(schedule, proposals) for schedule in schedules]

    def dispatched(
        self, schedule: Schedule, bucket: Bucket, moved: list[bool], drafted: bool
    ) -> None:
        """Its drafts are proposed on the host, from the tokens the last retired step gave."""

    def observe(self, schedule: Schedule, bucket: Bucket, drafts: np.ndarray | None) -> None:
        """Learns nothing from the target's step."""

    def release_done(self) -> None:
        """Holds nothing past a step."""

    def warmup(self) -> None:
        """Compiles nothing."""
