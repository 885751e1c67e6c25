"""The step-input builder: a `Schedule` and a `Bucket` in, a fresh padded `StepInputs` out.

Every array is allocated at bucket size, zero-filled (NULL padding by construction) and filled from
the schedule alone: decode rows first, then prefill rows, then padding. Nothing is carried over
from an earlier step, which removes the stale-row bug class of persistent metadata buffers.
Uses numpy only: `jmamba.step.inputs` and `runtime.core.sampling_inputs` are jax-free, so the host
side never loads jax (docs/architecture.md section 3). A row's sequence is anything with the
`RowSequence` fields: a `Request`, or a drafter's view of one.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable
from typing import NamedTuple

import numpy as np

from jmamba.step.inputs import DecodeRows, NextTokens, PrefillRows, StepInputs
from runtime.core.allowed_tokens import allowed_bitmask, grammar_rows, with_grammar_rows
from runtime.core.buckets import Bucket
from runtime.core.config import EngineConfig
from runtime.core.penalties import PenaltyHistory, PenaltyRow, penalty_inputs
from runtime.core.request import SamplingRow
from runtime.core.sampling_inputs import SamplingInputs, SamplingMode, mask_width
from runtime.core.schedule import RowSequence, ScheduledRow, StepSchedule
from runtime.core.step_batch import ChainedRows, StepBatch

Masks = list[tuple[int, tuple[int, ...]]]  # (logits row, token ids it may not produce)


def boundary_columns(bucket: Bucket, state_block_size: int) -> int:
    """NB, the boundary-slot columns of a prefill row: the most state block boundaries a row of at
    most T_p tokens crosses (a row starts on a multiple of the chunk size, which divides
    state_block_size, so it crosses at most ceil(T_p / state_block_size))."""
    return -(-bucket.num_prefill_tokens // state_block_size)


class _Arrays:
    """Zeroed numpy arrays of one bucket (every padding value is NULL / 0 / False).

    `state_block_size` > 0 adds the prefill rows' boundary slots (prefix caching);
    `chain_width` is the widest decode row a row may chain on (`ChainedRows`; 1: none);
    `vocab_size` > 0 adds the allowed-token bitmask, all ones (`runtime.core.allowed_tokens`).
    """

    def __init__(
        self,
        bucket: Bucket,
        max_blocks: int,
        state_block_size: int,
        chain_width: int = 1,
        vocab_size: int = 0,
    ) -> None:
        rd, w, rp, n = (
            bucket.num_decode_rows,
            bucket.width,
            bucket.num_prefill_rows,
            bucket.num_logits,
        )
        t = bucket.num_tokens
        i32 = np.int32
        self.token_ids, self.positions, self.kv_slots = (np.zeros(t, i32) for _ in range(3))
        self.token_sources = np.zeros(t, i32)
        self.d_query_lens, self.d_seq_lens, self.d_read = (np.zeros(rd, i32) for _ in range(3))
        self.d_write = np.zeros((rd, w), i32)
        self.d_table = np.zeros((rd, max_blocks), i32)
        self.d_may_shift, self.d_fallback = np.zeros(rd, bool), np.zeros((rd, chain_width), i32)
        self.qsl = np.zeros(rp + 1, i32)
        self.p_computed, self.p_seq_lens = np.zeros(rp, i32), np.zeros(rp, i32)
        self.p_read, self.p_write = np.zeros(rp, i32), np.zeros(rp, i32)
        self.p_initial = np.zeros(rp, bool)
        self.p_table = np.zeros((rp, max_blocks), i32)
        self.p_next_ids, self.p_next_samples = np.zeros(rp, i32), np.zeros(rp, bool)
        self.state_block_size = state_block_size
        self.p_boundary = (
            np.zeros((rp, boundary_columns(bucket, state_block_size)), i32)
            if state_block_size
            else None
        )
        self.logits_indices = np.zeros(n, i32)
        self.temperature, self.top_p = np.zeros(n, np.float32), np.ones(n, np.float32)
        self.top_k, self.counters = np.zeros(n, i32), np.zeros(n, i32)
        self.seeds = np.zeros(n, np.uint32)
        self.allowed = allowed_bitmask(n, vocab_size)

    def step_inputs(self) -> StepInputs:
        decode = DecodeRows(
            self.d_query_lens, self.d_seq_lens, self.d_read, self.d_write, self.d_table
        )
        prefill = PrefillRows(
            self.qsl,
            self.p_computed,
            self.p_seq_lens,
            self.p_initial,
            self.p_read,
            self.p_write,
            self.p_table,
            self.p_boundary,
            self.state_block_size,
        )
        return StepInputs(
            self.token_ids, self.positions, self.kv_slots, decode, prefill, self.logits_indices
        )

    def sampling(self, masks: Masks, penalized: list[PenaltyRow]) -> SamplingInputs:
        width = mask_width(max((len(ids) for _, ids in masks), default=0))
        masked_ids = np.zeros((self.temperature.size, width), np.int32)
        num_masked = np.zeros(self.temperature.size, np.int32)
        for row, ids in masks:
            masked_ids[row, : len(ids)] = ids
            num_masked[row] = len(ids)
        return SamplingInputs(
            self.temperature,
            self.top_k,
            self.top_p,
            self.seeds,
            self.counters,
            masked_ids,
            num_masked,
            penalty_inputs(penalized, self.temperature.size),
            self.allowed,
        )

    def set_sampling[S: RowSequence](self, row: int, item: ScheduledRow[S]) -> None:
        request = item.request
        params = request.sampling_params
        self.temperature[row] = params.temperature
        self.top_k[row] = params.top_k
        self.top_p[row] = params.top_p
        self.seeds[row] = request.seed
        self.counters[row] = request.num_sampled

    def batch(self, sampling: SamplingInputs, mode: SamplingMode, rows: np.ndarray) -> StepBatch:
        """The `StepBatch` of these arrays, with `sample_rows` = `rows`."""
        following = NextTokens(self.p_next_ids, self.p_next_samples)
        chained = ChainedRows(self.d_may_shift, self.d_fallback)
        return StepBatch(
            self.step_inputs(), sampling, mode, rows, self.token_sources, following, chained
        )

    def set_following[S: RowSequence](self, row: int, item: ScheduledRow[S]) -> None:
        """Prefill row `row`: the known token after its chunk, or that it samples the next."""
        end, request = item.start + item.num_tokens, item.request
        if end < request.num_tokens:
            self.p_next_ids[row] = request.token_at(end)
        else:
            self.p_next_samples[row] = True

    def set_tokens[S: RowSequence](
        self, first: int, item: ScheduledRow[S], block_size: int
    ) -> None:
        """Fill token lanes [first, first + n) with the item's token ids, positions, KV slots."""
        n, start = item.num_tokens, item.start
        lanes = slice(first, first + n)
        self.token_ids[lanes] = item.token_ids
        positions = np.arange(start, start + n, dtype=np.int32)
        self.positions[lanes] = positions
        blocks = item.request.block_ids
        if blocks:
            table = np.asarray(blocks, np.int32)
            self.kv_slots[lanes] = (
                table[positions // block_size] * block_size + positions % block_size
            )


def build_step[S: RowSequence](
    schedule: StepSchedule[S],
    bucket: Bucket,
    *,
    block_size: int,
    max_blocks: int,
    state_block_size: int = 0,
    chain_width: int = 1,
    vocab_size: int = 0,
) -> StepBatch:
    """Build the padded inputs of one step (shapes fixed by `bucket`, values from `schedule`).

    `state_block_size` > 0 (prefix caching on) gives prefill rows their boundary slots;
    `chain_width`: the widest decode row (1 + K) a row may chain on (`ChainedRows`);
    `vocab_size` > 0: the allowed-token bitmask, its grammar rows filled by their matchers.
    """
    a = _Arrays(bucket, max_blocks, state_block_size, chain_width, vocab_size)
    sample_rows, masks, penalized = _fill_decode(a, schedule.decodes, bucket.width, block_size)
    num_decode_lanes = bucket.num_decode_rows * bucket.width
    offset = 0
    for j, item in enumerate(schedule.prefills):
        request = item.request
        a.qsl[j + 1] = offset + item.num_tokens
        a.p_computed[j] = item.start
        a.p_seq_lens[j] = item.start + item.num_tokens
        a.p_initial[j] = item.start > 0
        # A first chunk reads NULL (the scheduler's read_slot): pools are never zeroed.
        a.p_read[j] = item.read_slot
        a.p_write[j] = item.write_slot
        a.p_table[j, : len(request.block_ids)] = request.block_ids
        if item.boundary_slots:
            if a.p_boundary is None:
                raise ValueError(
                    "the schedule caches boundary states: build with the config's "
                    "boundary_block_size, not state_block_size=0"
                )
            a.p_boundary[j, : len(item.boundary_slots)] = item.boundary_slots
        a.set_tokens(num_decode_lanes + offset, item, block_size)
        a.set_following(j, item)
        offset += item.num_tokens
        a.logits_indices[num_decode_lanes + j] = num_decode_lanes + offset - 1
        a.set_sampling(num_decode_lanes + j, item)
        sample_rows.append(num_decode_lanes + j)
        if request.masked_token_ids:
            masks.append((num_decode_lanes + j, request.masked_token_ids))
        if request.sampling_row.penalized:  # a prefill row's tokens are all on the host
            penalized.append((num_decode_lanes + j, _history(request), False))
    a.qsl[len(schedule.prefills) + 1 :] = offset  # padding rows have length 0
    grammars = grammar_rows(schedule, bucket.width, num_decode_lanes)
    a.allowed = with_grammar_rows(a.allowed, grammars)
    sampling = a.sampling(masks, penalized)
    return a.batch(sampling, SamplingMode.of(sampling), np.asarray(sample_rows, np.int64))


def _fill_decode[S: RowSequence](
    a: _Arrays, decodes: list[ScheduledRow[S]], width: int, block_size: int
) -> tuple[list[int], Masks, list[PenaltyRow]]:
    """Fill the decode section with whole-array writes (this is the per-step hot path).

    One Python pass gathers what changes per step into one table, another each request's fixed
    sampling values (`Request.sampling_row`); the rest is numpy.
    Returns each row's last live lane, the masks of the lanes still short of `min_tokens` (lane
    t of a row samples output number len(outputs) + t: its counter and its mask follow that) and
    the penalized lanes.
    """
    n = len(decodes)
    if n == 0:
        return [], [], []
    requests = [item.request for item in decodes]
    scalars = (_decode_scalars(i, r) for i, r in zip(decodes, requests, strict=True))
    table = _table(scalars, n, len(DecodeScalars._fields), np.int64)
    row: DecodeScalars[np.ndarray] = DecodeScalars(*table.T)
    query_lens, starts, num_blocks, sources = row.query_len, row.start, row.num_blocks, row.source
    fixed = (r.sampling_row for r in requests)
    params = _table(fixed, n, len(SamplingRow._fields), np.float64)  # [n, SamplingRow]
    a.d_query_lens[:n] = query_lens
    a.d_seq_lens[:n] = starts + query_lens
    a.d_read[:n] = row.read_slot
    lane_live = np.arange(width)[None, :] < query_lens[:, None]
    a.d_write[:n] = np.where(lane_live, row.write_slot[:, None], 0)
    reached = -(-(starts + query_lens) // block_size)
    if (num_blocks > reached).any():  # blocks held for rejected draft positions stay unlisted
        num_blocks = np.minimum(num_blocks, reached)
        block_lists = [r.block_ids[:b] for r, b in zip(requests, num_blocks.tolist(), strict=True)]
    else:
        block_lists = [r.block_ids for r in requests]
    total_blocks = int(num_blocks.sum())
    if total_blocks:
        block_rows, block_columns = _ragged(num_blocks)
        blocks = itertools.chain.from_iterable(block_lists)
        a.d_table[block_rows, block_columns] = np.fromiter(blocks, np.int32, total_blocks)
    num_lanes = int(query_lens.sum())
    if num_lanes > n:  # rows with drafts: each of their lanes writes its own fresh slot
        lane_slots = itertools.chain.from_iterable(
            item.lane_slots or (item.write_slot,) for item in decodes
        )
        lane_rows, lane_columns = _ragged(query_lens)
        a.d_write[lane_rows, lane_columns] = np.fromiter(lane_slots, np.int32, num_lanes)
    _fill_chained(a, decodes)
    if num_lanes == n:  # one token per row: whole columns of the tables, no gather
        rows, index, lane_params = np.arange(n), np.arange(0, n * width, width), params
        lanes: int | np.ndarray = 0  # every token is lane 0 of its row
        a.token_ids[index] = row.first_token
        a.token_sources[index] = sources
    else:
        rows, lanes = _ragged(query_lens)
        index = rows * width + lanes
        lane_params = params[rows]  # the sampling values of each lane
        lane_tokens, lane_sources = _lane_tokens(decodes, row.first_token, sources)
        a.token_ids[index] = lane_tokens
        a.token_sources[index] = lane_sources
    positions = starts[rows] + lanes
    a.positions[index] = positions
    if total_blocks:
        blocks = a.d_table[rows, positions // block_size]
        a.kv_slots[index] = blocks * block_size + positions % block_size
    a.logits_indices[index] = index
    outputs = row.num_outputs[rows] + lanes  # the output index each lane samples
    a.counters[index] = outputs
    lane: SamplingRow[np.ndarray] = SamplingRow(*lane_params.T)
    a.temperature[index], a.top_k[index], a.top_p[index] = lane.temperature, lane.top_k, lane.top_p
    a.seeds[index] = lane.seed
    sample_rows = np.arange(n) * width + query_lens - 1  # each row's last live lane
    short = np.nonzero(outputs < lane.min_tokens)[0]  # fewer outputs than min_tokens
    masks = [(int(index[i]), decodes[rows[i]].request.stop_ids) for i in short]
    penalized = np.flatnonzero(lane.penalized)  # usually none: one numpy pass, no Python
    if penalized.size:
        # Lane 0 of a row whose token comes from the previous step (a source) feeds an output
        # the host has not appended yet: the device counts it.
        pending = (sources[rows] != 0) & (lanes == 0)
        penalties = [(int(index[i]), decodes[rows[i]].request, pending[i]) for i in penalized]
    else:
        penalties = []
    masks = [(row, ids) for row, ids in masks if ids]
    return sample_rows.tolist(), masks, [(i, _history(r), bool(p)) for i, r, p in penalties]


def _fill_chained[S: RowSequence](a: _Arrays, decodes: list[ScheduledRow[S]]) -> None:
    """Rows that may move back by their previous row's rejected drafts (`ChainedRows`): column
    d of a row's fallback slots is lane K - d of the row it chains on. Nothing to do (no pass
    over the rows) in an engine without drafts, whose rows chain on none."""
    if a.d_fallback.shape[1] == 1:
        return
    for i, item in enumerate(decodes):
        lanes = item.chained_lanes
        if lanes:
            a.d_may_shift[i] = True
            a.d_fallback[i, 1 : len(lanes)] = lanes[-2::-1]


def _lane_tokens[S: RowSequence](
    decodes: list[ScheduledRow[S]], first_tokens: np.ndarray, sources: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Token id and source of every live lane of the decode rows, rows in order: the row's
    tokens the host has (or its first token pending on the device: `_decode_scalars`), then its
    drafts (known ids, or entries of the previous step's carried drafts: `draft_sources`)."""
    tokens: list[int] = []
    lane_sources: list[int] = []
    for item, first, source in zip(decodes, first_tokens.tolist(), sources.tolist(), strict=True):
        known = item.request.token_ids(item.start, item.start + item.num_tokens)
        head, head_sources = (known, [0] * len(known)) if known else ([first], [source])
        k = item.num_tokens - len(head)
        if item.draft_sources:
            tokens += head + [0] * k
            lane_sources += head_sources + list(item.draft_sources[:k])
        else:
            tokens += head + list(item.draft_token_ids[:k])
            lane_sources += head_sources + [0] * k
    return np.asarray(tokens, np.int32), np.asarray(lane_sources, np.int32)


def _history(request: RowSequence) -> PenaltyHistory:
    """A penalized request's history, caught up with the outputs the host has."""
    if request.penalty_history is None:  # `sampling_row.penalized` promised one
        raise ValueError(f"a penalized row of {request!r} has no penalty history")
    return request.penalty_history.caught_up(request.output_token_ids)


def _table(rows: Iterable[tuple[float, ...]], n: int, width: int, dtype: type) -> np.ndarray:
    """[n, width] from n rows of `width` numbers (twice as fast as `np.array` of NamedTuples)."""
    return np.fromiter(itertools.chain.from_iterable(rows), dtype, n * width).reshape(n, width)


def _ragged(lengths: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """For rows of `lengths` items: (row of each item, index of each item in its row)."""
    rows = np.repeat(np.arange(lengths.size), lengths)
    return rows, np.arange(rows.size) - np.repeat(np.cumsum(lengths) - lengths, lengths)


class DecodeScalars[T](NamedTuple):
    """What changes from step to step in a decode row (`Request.sampling_row` holds the rest):
    `DecodeScalars[int]` for one row, `DecodeScalars[np.ndarray]` for the columns of the table
    of a step's rows. A first token still pending on the device is 0, from source
    `pending_row + 1` (0: the host has it)."""

    query_len: T
    start: T
    read_slot: T
    write_slot: T  # lane 0's
    num_blocks: T
    num_outputs: T
    first_token: T
    source: T


def _decode_scalars[S: RowSequence](item: ScheduledRow[S], request: S) -> tuple[int, ...]:
    """A decode row's `DecodeScalars`, as a plain tuple in its field order: built per row per
    step, and a NamedTuple built by keyword cost 0.87 us a row more (0.2 ms a step at 256)."""
    start = item.start
    if start < request.num_tokens:
        token, source = request.token_at(start), 0
    else:
        token, source = 0, request.pending_row + 1
    write = item.lane_slots[0] if item.lane_slots else item.write_slot
    num_blocks, num_outputs = len(request.block_ids), request.num_sampled
    return (item.num_tokens, start, item.read_slot, write, num_blocks, num_outputs, token, source)


def build_dummy(
    bucket: Bucket,
    *,
    max_blocks: int,
    state_block_size: int = 0,
    chain_width: int = 1,
    vocab_size: int = 0,
) -> StepBatch:
    """An all-padding step of `bucket`'s shape (warm-up, idle data-parallel rank)."""
    a = _Arrays(bucket, max_blocks, state_block_size, chain_width, vocab_size)
    return a.batch(a.sampling([], []), SamplingMode(), np.zeros(0, np.int64))


def build_rank[S: RowSequence](
    schedule: StepSchedule[S], bucket: Bucket, config: EngineConfig, *, state_block_size: int = 0
) -> StepBatch:
    """One rank's step of `bucket`: its schedule's inputs, or (an idle rank, an empty schedule)
    the all-padding dummy step."""
    shapes = dict(
        max_blocks=config.max_blocks_per_seq,
        state_block_size=state_block_size,
        chain_width=config.decode_width,
        vocab_size=config.vocab_size,
    )
    if schedule.is_empty:
        return build_dummy(bucket, **shapes)
    return build_step(schedule, bucket, block_size=config.block_size, **shapes)
