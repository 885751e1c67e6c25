"""Verification: which drafts a step accepted, and the acceptance counters (numpy, no jax).

A decode row with k drafts carries 1 + k lanes: the request's last sampled token and its drafts.
Lane t writes the state after its token to its own fresh slot; the sampler returns, per lane, the
target's token and whether it equals the draft the next lane fed. The host keeps the longest
accepted prefix d_1..d_a and the target's token after it (a + 1 new tokens), and the slot of
lane a becomes the request's state slot (`SlotPlanner.keep_lane`): rollback by slot choice, no
state copy. Attention KV of rejected positions is simply overwritten later.

Drafters hand their proposals to the rows through `with_drafts`; `check_verifiable` says which
sampling params verification serves (no log-probabilities, no penalties).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import numpy as np

from runtime.core.request import Request
from runtime.core.sampling_params import SamplingParams
from runtime.core.schedule import Schedule


@dataclasses.dataclass
class SpeculationStats:
    """Acceptance counters of one data-parallel rank.

    Attributes:
      num_rows: decode rows that carried drafts, verified.
      num_drafted: drafts verified.
      num_accepted: drafts accepted (counted before a stop token cuts the new tokens).
    """

    num_rows: int = 0
    num_drafted: int = 0
    num_accepted: int = 0

    def add(self, other: SpeculationStats) -> None:
        """Count `other` in (in place: a rank's counters are one object for its life)."""
        self.num_rows += other.num_rows
        self.num_drafted += other.num_drafted
        self.num_accepted += other.num_accepted

    @classmethod
    def total(cls, parts: list[SpeculationStats]) -> SpeculationStats:
        """Every counter summed over `parts` (the ranks of an engine)."""
        total = cls()
        for part in parts:
            total.add(part)
        return total

    @property
    def acceptance_rate(self) -> float:
        """Accepted over drafted drafts (0 when none were drafted)."""
        return self.num_accepted / self.num_drafted if self.num_drafted else 0.0

    @property
    def mean_acceptance_length(self) -> float:
        """Tokens a row with drafts gains per step: 1 + accepted drafts per such row (1 without
        rows)."""
        return 1.0 + (self.num_accepted / self.num_rows if self.num_rows else 0.0)


def verified_tokens(
    schedule: Schedule,
    sample_rows: np.ndarray,
    width: int,
    tokens: np.ndarray,
    accepted: np.ndarray,
    stale: Sequence[bool] = (),
) -> tuple[list[int], list[list[int]], SpeculationStats]:
    """Split one rank's sampled lanes into what `Scheduler.retire` appends.

    Args:
      schedule: the rank's schedule (decode items first; an item has num_tokens - 1 drafts).
      sample_rows: [items] each item's last live logits row (`StepBatch.sample_rows`).
      width: W, lanes per decode row of the step's bucket (1: no row carried drafts).
      tokens: [N] per logits row, the target's token.
      accepted: [N] per logits row, whether its token equals the draft the next lane fed.
      stale: per decode item, whether its tokens will be dropped (`RowsInFlight.is_stale`): it
        counts in no counter.
    Returns:
      (sampled, drafts, stats): per item the target's token after its accepted drafts, and the
      accepted drafts themselves (empty for items without drafts); the step's counters.
    """
    sampled = tokens[sample_rows].tolist()
    if width == 1:  # no row carried drafts: the plain path, as cheap as before
        return sampled, [], SpeculationStats()
    num_decodes = len(schedule.decodes)
    drafts: list[list[int]] = [[] for _ in sample_rows]
    num_drafts = np.array([item.num_tokens - 1 for item in schedule.decodes], np.int64)
    flags = accepted[: num_decodes * width].reshape(num_decodes, width).astype(bool)
    flags &= np.arange(width)[None, :] < num_drafts[:, None]
    num_accepted = np.cumprod(flags, axis=1).sum(axis=1)  # the longest accepted prefix
    lane_tokens = tokens[: num_decodes * width].reshape(num_decodes, width).tolist()
    for i, (lanes, a) in enumerate(zip(lane_tokens, num_accepted.tolist(), strict=True)):
        drafts[i] = lanes[:a]  # == the drafts d_1..d_a
        sampled[i] = lanes[a]
    if len(stale):
        counted = ~np.asarray(stale, bool)
        num_drafts, num_accepted = num_drafts[counted], num_accepted[counted]
    stats = SpeculationStats(
        int((num_drafts > 0).sum()), int(num_drafts.sum()), int(num_accepted.sum())
    )
    return sampled, drafts, stats


def with_drafts(schedule: Schedule, proposals: dict[Request, list[int]]) -> Schedule:
    """`schedule` with each decode row of 1 + k lanes given the first k tokens of its request's
    proposal (rows without lanes stay as they are)."""
    decodes = [
        item._replace(draft_token_ids=tuple(proposals[item.request][: item.num_tokens - 1]))
        if item.lane_slots
        else item
        for item in schedule.decodes
    ]
    return dataclasses.replace(schedule, decodes=decodes)


def check_verifiable(params: SamplingParams) -> None:
    """ValueError for what a speculative engine does not compute: log-probabilities (lanes are
    verified on the device without them) and penalties (each lane's history would have to hold
    the drafts before it, which the penalty tables do not)."""
    if params.logprobs is not None:
        raise ValueError(
            f"logprobs={params.logprobs}: log-probabilities are not computed with speculative "
            "decoding (ask for them on an engine without `speculative`)"
        )
    if params.is_penalized:
        penalties = (
            f"presence_penalty={params.presence_penalty}, "
            f"frequency_penalty={params.frequency_penalty}, "
            f"repetition_penalty={params.repetition_penalty}"
        )
        raise ValueError(
            f"{penalties}: penalties are not applied with speculative decoding (ask for them on "
            "an engine without `speculative`)"
        )
