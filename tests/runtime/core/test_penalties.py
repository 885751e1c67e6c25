"""Presence / frequency / repetition penalties: the sampler's penalized logits against a numpy
reference written from the definitions, the host's incremental history, the builder's tables
(decode, prefill, pending and padding rows) and the checks of the parameters. End to end through the
engine (synchronous and asynchronous, against a full-recompute loop):
tests/runtime/engine/test_async_scheduling.py; a speculative engine's refusal: test_speculative.py.
"""

from __future__ import annotations

import collections
import dataclasses

import jax
import numpy as np
import pytest

from runtime.core.buckets import Bucket, BucketPolicy
from runtime.core.builder import build_dummy, build_step
from runtime.core.penalties import PenaltyHistory, penalty_inputs
from runtime.core.request import Request
from runtime.core.sampling_inputs import SamplingInputs, SamplingMode, penalty_width
from runtime.core.sampling_params import SamplingParams
from runtime.device.sampler import penalize, sample
from runtime.speculative.verify import check_verifiable
from tests.runtime.core.test_builder import BS, MAX_BLOCKS
from tests.runtime.core.test_scheduler import make_request, make_scheduler

VOCAB = 40

penalize_jit = jax.jit(penalize)
sample_jit = jax.jit(sample, static_argnums=2)


def reference_logits(
    logits: np.ndarray,
    prompt: list[int],
    outputs: list[int],
    presence: float,
    frequency: float,
    repetition: float,
) -> np.ndarray:
    """float64, token by token from the definitions: a token of the prompt or the output is
    divided by `repetition` if its logit is positive, else multiplied; then each output token
    loses frequency x its count + presence."""
    x = np.array(logits, np.float64)
    for token in set(prompt) | set(outputs):
        x[token] = x[token] / repetition if x[token] > 0 else x[token] * repetition
    for token, count in collections.Counter(outputs).items():
        x[token] -= frequency * count + presence
    return x


def params_of(presence: float = 0.0, frequency: float = 0.0, repetition: float = 1.0):
    return SamplingParams(
        presence_penalty=presence, frequency_penalty=frequency, repetition_penalty=repetition
    )


def test_penalized_logits_equal_the_definitions():
    """Random histories with repeated tokens, a pending fed token, negative and < 1 penalties,
    padding columns; rows without penalties (and padding rows) come back bit for bit."""
    rng = np.random.default_rng(7)
    rows = [  # (prompt, outputs, pending fed token or None, params); None params: no penalties
        (
            rng.integers(0, VOCAB, 12).tolist(),
            rng.integers(0, 10, 15).tolist(),
            None,
            (0.5, 0.3, 1.6),
        ),
        ([3, 3, 4], [4, 4, 9, 9, 9], 9, (1.0, 0.7, 1.0)),  # the pending 9 is a 4th
        (rng.integers(0, VOCAB, 30).tolist(), [], 5, (-1.5, -0.5, 0.6)),
        ([1, 2], [2, 7], None, None),
        (rng.integers(0, VOCAB, 5).tolist(), [8] * 6, None, (0.0, 2.0, 1.0)),
        ([6], [], None, (2.0, 0.0, 1.0)),  # presence only: nothing in the output yet
    ]
    n = len(rows) + 2  # two padding rows
    logits = (rng.standard_normal((n, VOCAB)) * 3).astype(np.float32)  # id 0 too: padding's
    histories, fed = [], np.zeros(n, np.int32)
    for row, (prompt, outputs, pending, values) in enumerate(rows):
        fed[row] = 11 if pending is None else pending  # an unpending fed token is not counted
        if values is not None:
            history = PenaltyHistory(prompt, params_of(*values)).caught_up(outputs)
            histories.append((row, history, pending is not None))
    tables = penalty_inputs(histories, n)
    got = np.asarray(penalize_jit(logits, tables, fed))
    for row, (prompt, outputs, pending, values) in enumerate(rows):
        if values is None:
            np.testing.assert_array_equal(got[row], logits[row])
            continue
        history = outputs + ([] if pending is None else [pending])
        want = reference_logits(logits[row], prompt, history, *values)
        np.testing.assert_allclose(got[row], want, rtol=1e-6, atol=1e-5, err_msg=f"row {row}")
    np.testing.assert_array_equal(got[len(rows) :], logits[len(rows) :])
    assert tables.token_ids.shape == (n, 32) and (tables.output_counts[:, 30:] == 0).all()


def test_greedy_picks_the_argmax_of_the_penalized_masked_logits():
    """`sample` penalizes before the min_tokens mask and the argmax: a negative presence keeps a
    repeated favourite ahead, a positive one lets another token win, a masked one never wins."""
    logits = np.zeros((2, VOCAB), np.float32)
    logits[:, 5], logits[:, 6], logits[:, 7] = 4.0, 3.0, -0.5
    history = PenaltyHistory([1], params_of(presence=-2.0, repetition=2.0)).caught_up([5, 7])
    tables = penalty_inputs([(0, history, False), (1, history, False)], 2)
    masked = np.array([[0, 0, 0, 0], [5, 0, 0, 0]], np.int32)
    params = SamplingInputs(
        np.zeros(2, np.float32),
        np.zeros(2, np.int32),
        np.ones(2, np.float32),
        np.zeros(2, np.uint32),
        np.zeros(2, np.int32),
        masked,
        np.array([0, 1], np.int32),
        tables,
    )
    mode = SamplingMode.of(params)
    assert mode == SamplingMode(mask_width=4, penalty_width=32)
    # 5 -> 4 / 2 + 2 = 4 beats 6 (3) and 7 (-0.5 * 2 + 2 = 1); row 1 masks 5.
    assert np.asarray(sample_jit(logits, params, mode)).tolist() == [5, 6]
    history = PenaltyHistory([1], params_of(presence=1.5, repetition=2.0)).caught_up([5, 7])
    tables = penalty_inputs([(0, history, False), (1, history, False)], 2)
    tokens = sample_jit(logits, params._replace(penalties=tables), mode)
    assert np.asarray(tokens).tolist() == [6, 6]  # 5 -> 4 / 2 - 1.5 = 0.5 < 3


def test_history_lists_distinct_tokens_once_and_counts_outputs_incrementally():
    """Prompt ids first (duplicates once), then new output ids in order of appearance; outputs
    counted once however often the history catches up, past its first capacity."""
    history = PenaltyHistory([4, 2, 4, 9], params_of(presence=0.5))
    assert history.token_ids.tolist() == [4, 2, 9] and history.num_prompt_ids == 3
    outputs = [2, 5, 5]
    history.caught_up(outputs).caught_up(outputs)
    assert history.token_ids.tolist() == [4, 2, 9, 5]
    assert history.output_counts.tolist() == [0, 1, 0, 2]
    outputs += list(range(10, 40)) + [4]
    history.caught_up(outputs)
    assert history.num_columns == 4 + 30 and history.output_counts[0] == 1
    assert history.token_ids[4:].tolist() == list(range(10, 40))
    assert history.values == (0.5, 0.0, 1.0)


def penalized_request(name: str, prompt: list[int], **penalties) -> Request:
    params = SamplingParams(max_tokens=8, **penalties)
    return Request(name, prompt, params, seed=0)


def row_of(batch, schedule, request) -> int:
    items = [item.request for item in schedule.items]
    return int(batch.sample_rows[items.index(request)])


def assert_row_lists(tables, row: int, prompt: list[int], outputs: list[int]) -> None:
    """Row `row` lists exactly the distinct tokens of prompt + outputs, with their output counts
    and prompt membership; its other columns are padding."""
    ids, counts = tables.token_ids[row], tables.output_counts[row]
    live = ids.tolist()[: len(set(prompt + outputs))]
    assert sorted(live) == sorted(set(prompt + outputs))
    assert counts[: len(live)].tolist() == [outputs.count(t) for t in live]
    assert tables.in_prompt[row, : len(live)].tolist() == [t in prompt for t in live]
    assert not ids[len(live) :].any() and not counts[len(live) :].any()
    assert not tables.in_prompt[row, len(live) :].any()


def test_builder_tables_of_decode_prefill_and_padding_rows():
    """A penalized decode row and a penalized prefill row list their histories, a plain row and
    the padding rows are neutral, the mode agrees with `of_requests`, and the step validates."""
    scheduler = make_scheduler()
    decoding = penalized_request("d", [3, 1, 3], repetition_penalty=1.3, frequency_penalty=0.4)
    plain = make_request(3)
    for request in (decoding, plain):
        scheduler.add(request)
    for token in (6, 3):
        scheduler.postprocess(s := scheduler.schedule(), [token] * len(s.items))
    prefilling = penalized_request("p", [8, 9, 8, 10, 11], presence_penalty=-1.0)
    scheduler.add(prefilling)
    schedule = scheduler.schedule()
    assert [i.request for i in schedule.decodes] == [decoding, plain]
    bucket = BucketPolicy(scheduler.config).bucket_for(schedule)
    batch = build_step(schedule, bucket, block_size=BS, max_blocks=MAX_BLOCKS)
    batch.validate(scheduler.config, chunk_size=4, vocab_size=VOCAB)
    tables = batch.sampling.penalties
    assert batch.mode.penalty_width == 32
    assert SamplingMode.of_requests([i.request for i in schedule.items]) == batch.mode
    d, p = row_of(batch, schedule, decoding), row_of(batch, schedule, prefilling)
    assert_row_lists(tables, d, [3, 1, 3], [6, 3])
    assert_row_lists(tables, p, [8, 9, 8, 10, 11], [])
    assert tables.repetition[d] == np.float32(1.3) and tables.frequency[d] == np.float32(0.4)
    assert tables.presence[p] == -1.0 and tables.repetition[p] == 1.0
    neutral = [r for r in range(tables.pending.size) if r not in (d, p)]
    assert not tables.token_ids[neutral].any() and not tables.output_counts[neutral].any()
    assert not tables.in_prompt[neutral].any() and not tables.pending.any()
    assert (tables.repetition[neutral] == 1).all() and not tables.presence[neutral].any()
    assert not tables.frequency[neutral].any()


def test_a_pending_fed_token_is_marked_for_the_device():
    """Asynchronous scheduling: the next step is built before the token is on the host. The row
    lists the known outputs only and is marked pending (its lane takes a token source); a
    request without penalties pays nothing (no tables in its steps)."""
    scheduler = make_scheduler()
    request = penalized_request("a", [2, 4], presence_penalty=0.5)
    plain = make_request(4)
    scheduler.add(request)
    scheduler.add(plain)
    policy = BucketPolicy(scheduler.config)
    schedule = scheduler.schedule()
    batch = build_step(schedule, policy.bucket_for(schedule), block_size=BS, max_blocks=MAX_BLOCKS)
    scheduler.advance(schedule, batch.sample_rows)
    scheduler.retire(schedule, [7, 7])
    schedule = scheduler.schedule()
    batch = build_step(schedule, policy.bucket_for(schedule), block_size=BS, max_blocks=MAX_BLOCKS)
    scheduler.advance(schedule, batch.sample_rows)  # dispatched: token 2 pending
    pending = scheduler.schedule()
    batch = build_step(pending, policy.bucket_for(pending), block_size=BS, max_blocks=MAX_BLOCKS)
    config = scheduler.config
    batch.validate(config, chunk_size=4, vocab_size=VOCAB, num_carried=8)
    row = row_of(batch, pending, request)
    tables = batch.sampling.penalties
    assert batch.token_sources[row] > 0 and np.flatnonzero(tables.pending).tolist() == [row]
    assert_row_lists(tables, row, [2, 4], [7])
    plain_only = make_scheduler()
    plain_only.add(make_request(4))
    schedule = plain_only.schedule()
    bucket = BucketPolicy(plain_only.config).bucket_for(schedule)
    batch = build_step(schedule, bucket, block_size=BS, max_blocks=MAX_BLOCKS)
    assert batch.sampling.penalties is None and batch.mode.penalty_width == 0
    assert plain.penalty_history is None and plain.sampling_row[-1] == 0.0


def test_validate_refuses_a_pending_row_fed_from_the_host():
    scheduler = make_scheduler()
    request = penalized_request("v", [2, 4, 6], repetition_penalty=1.2)
    scheduler.add(request)
    scheduler.postprocess(scheduler.schedule(), [5])
    schedule = scheduler.schedule()
    bucket = BucketPolicy(scheduler.config).bucket_for(schedule)
    batch = build_step(schedule, bucket, block_size=BS, max_blocks=MAX_BLOCKS)
    batch.validate(scheduler.config, chunk_size=4, vocab_size=VOCAB)
    batch.sampling.penalties.pending[0] = True
    with pytest.raises(ValueError, match="count a pending output"):
        batch.validate(scheduler.config, chunk_size=4, vocab_size=VOCAB)


def test_with_mode_widens_tables_and_gives_an_idle_rank_neutral_ones():
    """Data-parallel ranks agree on the widest table: narrower ones gain padding columns, a rank
    without penalties (or idle) neutral tables."""
    history = PenaltyHistory(list(range(20)), params_of(frequency=1.0)).caught_up([25, 25])
    mode = SamplingMode(penalty_width=penalty_width(70))
    assert mode.penalty_width == 128
    dummy = build_dummy(Bucket(2, 1, 8, 2), max_blocks=MAX_BLOCKS).with_mode(mode)
    tables = dummy.sampling.penalties
    assert tables.token_ids.shape == (4, 128) and SamplingMode.of(dummy.sampling) == mode
    assert (tables.repetition == 1).all() and not tables.token_ids.any()
    narrow = dummy.sampling._replace(penalties=penalty_inputs([(1, history, False)], 4))
    batch = dataclasses.replace(dummy, sampling=narrow, mode=SamplingMode.of(narrow))
    wide = batch.with_mode(mode).sampling.penalties
    assert wide.token_ids.shape == (4, 128)
    assert wide.token_ids[1, :21].tolist() == [*range(20), 25]
    assert wide.output_counts[1].sum() == 2 and not wide.token_ids[1, 21:].any()
    with pytest.raises(ValueError, match="computes less"):
        batch.with_mode(SamplingMode())


@pytest.mark.parametrize(
    ("field", "value", "allowed"),
    [
        ("presence_penalty", 2.5, r"in \[-2.0, 2.0\]"),
        ("presence_penalty", float("nan"), "finite"),
        ("frequency_penalty", -3, r"in \[-2.0, 2.0\]"),
        ("frequency_penalty", "0.1", "number"),
        ("repetition_penalty", 0.0, "> 0.0"),
        ("repetition_penalty", True, "> 0.0"),
    ],
)
def test_bad_penalties_are_refused_naming_the_field(field, value, allowed):
    with pytest.raises(ValueError, match=f"{field}=.* must be .*{allowed}"):
        SamplingParams(**{field: value})


def test_penalties_are_refused_where_drafts_are_verified():
    check_verifiable(SamplingParams(max_tokens=3))
    for field, value in [("presence_penalty", 0.1), ("repetition_penalty", 1.1)]:
        with pytest.raises(ValueError, match=f"{field}={value}.*speculative"):
            check_verifiable(SamplingParams(**{field: value}))
