"""Bucket policy: the padded shape of a step, chosen from the scheduler's classification.

A `Bucket` fixes every shape of `StepInputs`: decode rows x lanes, prefill tokens, prefill rows.
Each distinct bucket is one compiled variant of the step (our analogue of a CUDA graph). A step
with no prefill row uses a decode-only bucket (`num_prefill_rows == 0`); a step with a prefill row
never does, however few tokens it has, so a one-token prefill cannot alias a decode (the vLLM
shape-only dispatch bug class).
"""

from __future__ import annotations

import bisect
import dataclasses
import functools
import operator
from collections.abc import Sequence
from typing import Literal, NamedTuple

import numpy as np

from runtime.core.config import EngineConfig
from runtime.core.sampling_inputs import SamplingMode, SamplingRequest
from runtime.core.schedule import Schedule


@dataclasses.dataclass(frozen=True, order=True)
class Bucket:
    """Static shape of one step variant.

    Attributes:
      num_decode_rows: R_d, decode rows (0 when the step has no decode).
      width: W = 1 + K token lanes per decode row (1 without speculative decoding, and in a
        bucket without decode rows).
      num_prefill_tokens: T_p, prefill tokens (0 in a decode-only step).
      num_prefill_rows: R_p, prefill rows (0 in a decode-only step).
    """

    num_decode_rows: int
    width: int
    num_prefill_tokens: int
    num_prefill_rows: int

    NUM_FIELDS = 4

    def as_array(self) -> np.ndarray:
        """[4] int32 (rows, width, prefill tokens, prefill rows): ranks agree on a step's bucket by
        the elementwise max of these."""
        return np.array(dataclasses.astuple(self), np.int32)

    @classmethod
    def from_array(cls, values: np.ndarray) -> Bucket:
        return cls(*(int(v) for v in values))

    @property
    def is_decode_only(self) -> bool:
        return self.num_prefill_rows == 0

    @property
    def num_tokens(self) -> int:
        return self.num_decode_rows * self.width + self.num_prefill_tokens

    @property
    def num_logits(self) -> int:
        return self.num_decode_rows * self.width + self.num_prefill_rows


_num_tokens = operator.attrgetter("num_tokens")


def lane_width(num_decode_rows: int, width: int) -> int:
    """A bucket's lanes per decode row: 1 when it has no decode row (one variant, whatever K)."""
    return width if num_decode_rows else 1


def round_up(sizes: tuple[int, ...], n: int) -> int:
    """Smallest size >= n (0 stays 0)."""
    if n == 0:
        return 0
    i = bisect.bisect_left(sizes, n)
    if i == len(sizes):
        raise ValueError(f"{n} exceeds the largest bucket {sizes[-1]}")
    return sizes[i]


class WarmupGroup(NamedTuple):
    """Buckets `Engine.warmup` compiles alike: whether their steps draft, and how many steps a
    program runs (synchronous and asynchronous steps share their programs)."""

    drafts: bool
    buckets: list[Bucket]
    steps: int = 1


class BucketPolicy:
    """Maps a `Schedule` to its `Bucket`; lists the decode buckets to compile at start-up."""

    def __init__(self, config: EngineConfig) -> None:
        self.decode_rows = config.decode_row_buckets
        self.prefill_tokens = config.prefill_token_buckets
        self.prefill_rows = config.prefill_row_buckets
        self.width = config.decode_width
        self.decode_steps = config.decode_steps
        self.max_num_seqs, self.budget = config.max_num_seqs, config.max_num_batched_tokens
        # One rank's schedule is a step's bucket: its fields bound one another (rows share
        # max_num_seqs, tokens the budget). Ranks agree on the elementwise max of theirs, which
        # may combine one rank's decode rows with another's prefill.
        self.one_schedule = config.data_parallel_size == 1
        spec = config.speculative
        # Steps without drafts: every step without speculation; with it, those its gate skips
        # (`SpeculativeConfig.drafts_selectively`).
        self.undrafted_steps = spec is None or spec.drafts_selectively
        # Drafting steps carry tokens (and drafts) when the engine is asynchronous and its
        # drafts come out of its own steps; else they run synchronously (`Engine.step`).
        self.drafting_carries = (
            config.async_scheduling and spec is not None and spec.drafts_on_device
        )
        # Lane widths: 1 + K, and 1 for steps in which no decode row has a draft (a drafter that
        # finds nothing would otherwise pay for K padding lanes per row).
        self.widths = tuple(sorted({1, self.width}))
        # The least a step's sampler computes (`EngineArgs.one_sampler_program`).
        self.least_mode = SamplingMode(sampled=config.one_sampler_program)

    def bucket_for(self, schedule: Schedule) -> Bucket:
        num_prefill_rows = len(schedule.prefills)
        num_decode_rows = round_up(self.decode_rows, len(schedule.decodes))
        lanes = 1  # without speculation every decode row has one lane: no pass over them
        if len(self.widths) > 1:
            lanes = max(map(_num_tokens, schedule.decodes), default=1)  # no Python loop
        return Bucket(
            num_decode_rows=num_decode_rows,
            width=lane_width(num_decode_rows, round_up(self.widths, lanes)),
            num_prefill_tokens=round_up(self.prefill_tokens, schedule.num_prefill_tokens),
            num_prefill_rows=round_up(self.prefill_rows, num_prefill_rows),
        )

    def needs(self, schedules: list[Schedule]) -> np.ndarray:
        """[Bucket.NUM_FIELDS + SamplingMode.NUM_FIELDS] int32: the elementwise max of what the
        ranks' schedules need (their buckets and sampler modes; zeros for an idle rank). Ranks
        and processes agree on a step by the elementwise max of these."""
        needs = np.zeros(Bucket.NUM_FIELDS + SamplingMode.NUM_FIELDS, np.int32)
        for schedule in schedules:
            if not schedule.is_empty:
                bucket = self.bucket_for(schedule).as_array()
                mode = self.mode_for([item.request for item in schedule.items])
                needs = np.maximum(needs, np.concatenate([bucket, mode.as_array()]))
        return needs

    def mode_for(self, requests: Sequence[SamplingRequest]) -> SamplingMode:
        """The sampler mode a step serving `requests` runs: what they need, and at least
        `least_mode` (a mode that computes more gives every row the same token)."""
        return self.widened(SamplingMode.of_requests(requests))

    def widened(self, mode: SamplingMode) -> SamplingMode:
        """`mode`, computing at least what `least_mode` does."""
        return SamplingMode.from_array(np.maximum(mode.as_array(), self.least_mode.as_array()))

    @staticmethod
    def agreed(needs: np.ndarray) -> tuple[Bucket, SamplingMode] | None:
        """The step's bucket and sampler mode from the agreed `needs`; None when no rank of any
        process has work (no step runs anywhere)."""
        sizes = Bucket.NUM_FIELDS
        if not needs[:sizes].any():
            return None
        return Bucket.from_array(needs[:sizes]), SamplingMode.from_array(needs[sizes:])

    def decode_buckets(self) -> list[Bucket]:
        """The decode-only variants, compiled by warm-up."""
        return [Bucket(rows, w, 0, 0) for rows in self.decode_rows for w in self.widths]

    def warmup_buckets(self, prefill: bool | Literal["alone"]) -> list[Bucket]:
        """The buckets `Engine.warmup` compiles: the decode-only ones; with "alone" also those of
        a lone prefill row; with True every bucket."""
        if prefill is True:
            return self.all_buckets()
        alone = self.lone_prefill_buckets() if prefill == "alone" else []
        return self.decode_buckets() + alone

    def warmup_variants(self, prefill: bool | Literal["alone"]) -> list[WarmupGroup]:
        """`warmup_buckets` split by how their steps run. Steps without drafts use the width-1
        buckets; steps that may carry drafts (a speculative engine's drafting steps) use every
        width. With `decode_steps` N > 1 the width-1 decode buckets are also compiled as
        programs of N steps."""
        buckets = self.warmup_buckets(prefill)
        groups = []
        if self.undrafted_steps:
            narrow = [b for b in buckets if b.width == 1]
            groups.append(WarmupGroup(False, narrow))
            if self.decode_steps > 1:
                decodes = [b for b in narrow if b.is_decode_only]
                groups.append(WarmupGroup(False, decodes, self.decode_steps))
        if self.width > 1:
            groups.append(WarmupGroup(True, buckets))
        return groups

    def warmup_modes(self, sampled: bool) -> tuple[SamplingMode, ...]:
        """The sampler modes warm-up compiles: greedy, and with `sampled` plain temperature
        sampling (an OpenAI client's default), each widened (`widened`): one mode with
        `one_sampler_program`."""
        asked = (SamplingMode(), SamplingMode(sampled=True)) if sampled else (SamplingMode(),)
        return tuple(dict.fromkeys(map(self.widened, asked)))

    @functools.cached_property
    def num_serving_programs(self) -> int:
        """`num_programs(True, sampled=True)`, counted once: what `--warmup all` makes ready
        (read by every engine snapshot, so not enumerated again each time)."""
        return self.num_programs(True, sampled=True)

    def num_programs(self, prefill: bool | Literal["alone"], sampled: bool) -> int:
        """The step programs `Engine.warmup(prefill=, sampled=)` makes ready. With
        `prefill=True, sampled=True`: every program a step can run unless a request asks for
        top-k / top-p, penalties, `min_tokens` stop masks or log-probabilities (each its own
        program, compiled on first use)."""
        groups = self.warmup_variants(prefill)
        return len(self.warmup_modes(sampled)) * sum(len(g.buckets) for g in groups)

    def lone_prefill_buckets(self) -> list[Bucket]:
        """The steps of one prefill row and nothing else: a request arriving at an idle engine
        (its first chunk, whatever its length)."""
        return [Bucket(0, 1, tokens, self.prefill_rows[0]) for tokens in self.prefill_tokens]

    def all_buckets(self) -> list[Bucket]:
        """Every bucket a step can run in: the decode-only ones, then each prefill shape with no
        decode row or with each decode shape, less those no schedule reaches (`reachable`)."""
        decode_shapes = [(0, 1)] + [(rows, w) for rows in self.decode_rows for w in self.widths]
        mixed = [
            Bucket(rows, w, tokens, prefill_rows)
            for rows, w in decode_shapes
            for tokens in self.prefill_tokens
            for prefill_rows in self.prefill_rows
        ]
        return self.decode_buckets() + [b for b in mixed if self.reachable(b)]

    def reachable(self, bucket: Bucket) -> bool:
        """Whether a step can run in `bucket`. With one rank, only if the least schedule that
        rounds up to it fits: its decode and prefill rows within max_num_seqs, its prefill rows
        within the bucket's prefill tokens (one a row at least), its decode lanes and prefill
        tokens within the token budget. With several, any bucket of the tables (the agreed one
        is the max of the ranks')."""
        if not self.one_schedule:
            return True
        decodes = _least(self.decode_rows, bucket.num_decode_rows)
        prefills = _least(self.prefill_rows, bucket.num_prefill_rows)
        if prefills > bucket.num_prefill_tokens:  # a prefill row has a token at least
            return False
        tokens = max(_least(self.prefill_tokens, bucket.num_prefill_tokens), prefills)
        lanes = decodes + (bucket.width > 1)  # a wide bucket: some row has a draft
        return decodes + prefills <= self.max_num_seqs and lanes + tokens <= self.budget

    @property
    def max_num_variants(self) -> int:
        """How many buckets a step can run in (`all_buckets`)."""
        return len(self.all_buckets())


def _least(sizes: tuple[int, ...], size: int) -> int:
    """The least count that rounds up to `size` in `sizes` (0 for 0)."""
    if size == 0:
        return 0
    below = [s for s in sizes if s < size]
    return (below[-1] if below else 0) + 1
