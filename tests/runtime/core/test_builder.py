"""The builder's StepInputs for real schedules pass validate(); planted bugs are each caught."""

from __future__ import annotations

import jax
import numpy as np
import pytest

from jmamba.step.invariants import check_step_inputs
from jmamba.step.pytree import StepInputs
from runtime.core.buckets import Bucket, BucketPolicy
from runtime.core.builder import build_dummy, build_step
from runtime.core.request import Request
from runtime.core.sampling_inputs import SamplingMode
from runtime.core.sampling_params import SamplingParams
from runtime.core.schedule import Schedule, ScheduledRequest
from tests.runtime.core.test_scheduler import make_request, make_scheduler

BS, MAX_BLOCKS = 4, 16  # block_size and table width of make_scheduler (max_model_len 64)


def mixed_batch():
    """A step with two decode rows and two prefill rows (one a continued chunk)."""
    scheduler = make_scheduler(max_num_batched_tokens=16)
    for n in (3, 5):
        scheduler.add(make_request(n, max_tokens=8))
    scheduler.postprocess(s := scheduler.schedule(), [7] * len(s.items))
    scheduler.add(make_request(23))
    scheduler.postprocess(s := scheduler.schedule(), [7] * len(s.items))
    scheduler.add(make_request(2))
    schedule = scheduler.schedule()
    assert len(schedule.decodes) == 2 and len(schedule.prefills) == 2
    bucket = BucketPolicy(scheduler.config).bucket_for(schedule)
    return schedule, bucket, build_step(schedule, bucket, block_size=BS, max_blocks=MAX_BLOCKS)


def validate(inputs: StepInputs) -> None:
    check_step_inputs(
        inputs, block_size=BS, chunk_size=4, num_blocks=65, num_slots=5, vocab_size=32
    )


def test_mixed_step_layout():
    """Decode lanes first, then ragged prefill tokens; logits on each row's last token."""
    schedule, bucket, batch = mixed_batch()
    inputs = batch.inputs
    validate(inputs)
    assert bucket == Bucket(2, 1, 16, 2)
    assert inputs.decode.query_lens.tolist() == [1, 1]
    assert inputs.decode.seq_lens.tolist() == [5, 7]
    assert inputs.prefill.query_start_loc.tolist() == [0, 11, 13]
    assert inputs.prefill.num_computed.tolist() == [12, 0]
    assert inputs.prefill.has_initial_state.tolist() == [True, False]
    assert inputs.prefill.read_slots[1] == 0  # a first chunk reads NULL
    assert inputs.positions[:2].tolist() == [4, 6]
    assert inputs.positions[2:15].tolist() == list(range(12, 23)) + [0, 1]
    assert inputs.logits_indices.tolist() == [0, 1, 12, 14]
    assert batch.sample_rows.tolist() == [0, 1, 2, 3]
    assert (inputs.token_ids[15:] == 0).all()
    assert schedule.prefills[0].token_ids == inputs.token_ids[2:13].tolist()


@pytest.mark.parametrize("bucket", [Bucket(4, 1, 8, 2), Bucket(2, 1, 0, 0), Bucket(0, 1, 8, 1)])
def test_dummy_step_is_all_null(bucket):
    """An all-padding step (also with an empty section) validates and every leaf is zero."""
    batch = build_dummy(bucket, max_blocks=MAX_BLOCKS)
    validate(batch.inputs)
    assert all(not np.asarray(leaf).any() for leaf in jax.tree.leaves(batch.inputs))


def corrupt(inputs: StepInputs, path: str, index, value) -> StepInputs:
    copy = jax.tree.map(np.copy, inputs)
    target = copy
    for name in path.split("."):
        target = getattr(target, name)
    target[index] = value
    return copy


@pytest.mark.parametrize(
    "path, index, value, message",
    [
        ("decode.block_table", (0, 5), -1, "negative index"),
        ("prefill.block_table", (1, 9), 3, "stale tail"),
        ("decode.read_slots", 1, 0, "read NULL"),
        ("prefill.write_slots", 1, 1, "write slots"),
        ("prefill.has_initial_state", 1, True, "has_initial_state"),
        ("positions", 3, 9, "positions"),
        ("logits_indices", 2, 7, "logits_indices"),
        ("kv_slots", 4, 1, "kv_slots"),
        ("token_ids", 15, 5, "padding tokens"),
        ("token_ids", 0, 40, "token_ids hold 40"),
        ("prefill.num_computed", 0, 14, "seq_lens|chunk_size"),
        ("decode.query_lens", 0, 0, "live rows must come before"),
    ],
)
def test_validate_catches_planted_bug(path, index, value, message):
    """Each planted violation of docs/architecture.md section 5 raises a ValueError naming it."""
    _, _, batch = mixed_batch()
    with pytest.raises(ValueError, match=message):
        validate(corrupt(batch.inputs, path, index, value))


def test_validate_catches_stale_padding_row():
    """A padding row that still holds a slot (the vLLM stale-row class) is rejected."""
    batch = build_dummy(Bucket(2, 1, 8, 2), max_blocks=MAX_BLOCKS)
    with pytest.raises(ValueError, match="padding rows"):
        validate(corrupt(batch.inputs, "decode.read_slots", 1, 3))


def test_bucket_policy_counts_and_decode_only():
    """Decode-only steps get R_p = 0; the variant count covers every combination a step
    reaches: 2 decode-only buckets, then (no decode, 2 or 4 decode rows) x 2 token buckets x 3
    prefill row buckets, less 4 decode rows (3 at least) beside 2 or 4 prefill rows (2 or 3 at
    least): more rows than max_num_seqs = 4."""
    scheduler = make_scheduler(max_num_seqs=4, max_num_batched_tokens=16)
    policy = BucketPolicy(scheduler.config)
    assert [b.num_decode_rows for b in policy.decode_buckets()] == [2, 4]  # no 1-row matmuls
    assert policy.max_num_variants == 2 + 3 * 2 * 3 - 2 * 2
    buckets = policy.all_buckets()  # what warmup(prefill=True) compiles
    assert len(set(buckets)) == len(buckets) == policy.max_num_variants
    assert all(b.is_decode_only == (b.num_prefill_tokens == 0) for b in buckets)


def test_sampling_rows_masks_and_mode():
    """Per-row sampling values; rows short of min_tokens mask their stop ids (EOS included);
    the step's SamplingMode says what the sampler must run."""
    scheduler = make_scheduler()
    stop_params = SamplingParams(max_tokens=5, min_tokens=2, stop_token_ids=(9,))
    masked = Request("m", [1, 2, 3], stop_params, seed=0, eos_token_ids=(7,))
    sampled = Request("s", [4, 5], SamplingParams(temperature=0.5, top_k=3), seed=11)
    for request in (masked, sampled, make_request(3)):
        scheduler.add(request)
    scheduler.postprocess(s := scheduler.schedule(), [4] * len(s.items))
    late = Request("l", [6], SamplingParams(max_tokens=3, min_tokens=1), seed=0, eos_token_ids=(7,))
    scheduler.add(late)
    schedule = scheduler.schedule()
    bucket = BucketPolicy(scheduler.config).bucket_for(schedule)
    batch = build_step(schedule, bucket, block_size=BS, max_blocks=MAX_BLOCKS)
    row = {i.request.request_id: r for i, r in zip(schedule.items, batch.sample_rows, strict=True)}
    s = batch.sampling
    assert batch.mode == SamplingMode(sampled=True, filtered=True, mask_width=4)
    assert SamplingMode.of_requests([i.request for i in schedule.items]) == batch.mode
    assert s.masked_ids[row["m"], :2].tolist() == [9, 7] and s.num_masked[row["m"]] == 2
    assert s.masked_ids[row["l"], 0] == 7 and s.num_masked[row["l"]] == 1
    assert s.num_masked.sum() == 3 and s.masked_ids.sum() == 9 + 7 + 7  # nothing else masked
    assert (s.temperature[row["s"]], s.top_k[row["s"]], s.seeds[row["s"]]) == (0.5, 3, 11)
    assert s.counters[row["s"]] == 1 and s.counters[row["l"]] == 0
    scheduler.postprocess(schedule, [4] * len(schedule.items))
    schedule = scheduler.schedule()  # `m` has its 2 tokens: no mask; `s` still samples
    batch = build_step(
        schedule,
        BucketPolicy(scheduler.config).bucket_for(schedule),
        block_size=BS,
        max_blocks=MAX_BLOCKS,
    )
    assert batch.mode == SamplingMode(sampled=True, filtered=True, mask_width=0)
    assert SamplingMode.of_requests([i.request for i in schedule.items]) == batch.mode
    asking = Request("k", [1], SamplingParams(logprobs=3), seed=0)
    assert SamplingMode.of_requests([asking, masked]) == SamplingMode(logprobs=True, top_logprobs=4)


def _decode_request(i: int, num_outputs: int) -> Request:
    """A running request of prompt [i + 1] * (3 + i) and `num_outputs` outputs, with blocks for
    up to 3 drafts."""
    params = SamplingParams(
        temperature=0.25 * i, top_k=i, top_p=1.0 - 0.125 * i, min_tokens=3, max_tokens=16
    )
    request = Request(str(i), [i + 1] * (3 + i), params, seed=100 + i, eos_token_ids=(2,))
    request.output_token_ids = [10 + i + t for t in range(num_outputs)]
    request.num_computed = request.num_tokens - 1
    request.block_ids = [20 + 8 * i + b for b in range(-(-(request.num_tokens + 3) // BS))]
    return request


def _reference_decode(items, width: int) -> dict[str, np.ndarray]:
    """The decode section lane by lane, in plain Python (independent of the builder's numpy)."""
    n = len(items)
    ref = {
        name: np.zeros(n * width, np.int64)
        for name in ("tokens", "positions", "kv_slots", "counters", "seeds", "top_k", "write")
    }
    ref.update(
        temperature=np.zeros(n * width),
        read=np.zeros(n, np.int64),
        table=np.zeros((n, MAX_BLOCKS), np.int64),
    )
    for row, item in enumerate(items):
        request = item.request
        known = request.prompt_token_ids + request.output_token_ids + list(item.draft_token_ids)
        ref["read"][row] = item.read_slot
        reached = -(-(item.start + item.num_tokens) // BS)
        ref["table"][row, :reached] = request.block_ids[:reached]
        for lane in range(item.num_tokens):
            k, pos = row * width + lane, item.start + lane
            ref["tokens"][k], ref["positions"][k] = known[pos], pos
            ref["kv_slots"][k] = request.block_ids[pos // BS] * BS + pos % BS
            ref["counters"][k] = len(request.output_token_ids) + lane
            ref["seeds"][k], ref["top_k"][k] = request.seed, request.sampling_params.top_k
            ref["temperature"][k] = request.sampling_params.temperature
            ref["write"][k] = item.lane_slots[lane] if item.lane_slots else item.write_slot
    return ref


@pytest.mark.parametrize(
    ("drafts", "all_lanes"),
    [
        (None, False),  # a plain engine's step: width 1
        ([[], [], []], False),  # no row drafted, in a wider bucket (another rank's drafts)
        ([[5], [], [6, 7]], False),  # rows with drafts write lanes, the other its own slot
        ([[], [5], []], True),  # one-lane rows with lane slots (the draft model's catch-up)
    ],
)
def test_decode_section_equals_a_lane_by_lane_reference(drafts, all_lanes):
    """Decode rows (plain, with drafts, both in one step) against a plain Python reference of
    every lane: a row with lane slots writes each lane to its own, a row without its write slot."""
    width = 1 if drafts is None else 3
    items = []
    for i in range(3):
        request = _decode_request(i, num_outputs=i)
        row_drafts = () if drafts is None else tuple(drafts[i])
        n = 1 + len(row_drafts)
        has_lanes = bool(row_drafts) or all_lanes
        lanes = tuple(range(40 + 3 * i, 40 + 3 * i + n)) if has_lanes else ()
        write = 0 if has_lanes else 30 + i
        item = ScheduledRequest(
            request,
            request.num_computed,
            n,
            4 + i,
            write,
            lane_slots=lanes,
            draft_token_ids=row_drafts,
        )
        items.append(item)
    bucket = Bucket(4, width, 0, 0)
    batch = build_step(Schedule(items, [], []), bucket, block_size=BS, max_blocks=MAX_BLOCKS)
    ref, inputs, s, n = _reference_decode(items, width), batch.inputs, batch.sampling, 3 * width
    assert inputs.token_ids[:n].tolist() == ref["tokens"].tolist()
    assert inputs.positions[:n].tolist() == ref["positions"].tolist()
    assert inputs.kv_slots[:n].tolist() == ref["kv_slots"].tolist()
    assert inputs.decode.write_slots[:3].reshape(-1).tolist() == ref["write"].tolist()
    assert inputs.decode.read_slots[:3].tolist() == ref["read"].tolist()
    assert inputs.decode.block_table[:3].tolist() == ref["table"].tolist()
    assert s.counters[:n].tolist() == ref["counters"].tolist()
    assert s.seeds[:n].tolist() == ref["seeds"].tolist()
    assert s.top_k[:n].tolist() == ref["top_k"].tolist()
    assert np.allclose(s.temperature[:n], ref["temperature"])
    assert (inputs.token_ids[n:] == 0).all() and (inputs.decode.write_slots[3:] == 0).all()
