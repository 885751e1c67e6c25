"""Speculative decoding on the host: config checks, prompt lookup, lane slots and draft grants in
the scheduler, per-lane sampling inputs, the accepted-prefix split, and validate()'s lane checks."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from jmamba.step.invariants import check_step_inputs
from runtime.core.buckets import Bucket, BucketPolicy
from runtime.core.builder import build_step
from runtime.core.engine_args import EngineArgs
from runtime.core.request import Request
from runtime.core.sampling_params import SamplingParams
from runtime.core.speculative_config import SpeculativeConfig
from runtime.speculative.ngram import lookup
from runtime.speculative.verify import verified_tokens, with_drafts
from tests.runtime.core.test_scheduler import make_request, make_scheduler

BS, MAX_BLOCKS = 4, 16  # make_scheduler: block_size 4, max_model_len 64


def spec_scheduler(k: int = 3, **options):
    return make_scheduler(speculative=SpeculativeConfig("ngram", k), **options)


def decoding(scheduler, request: Request, token: int = 5) -> Request:
    """Run `request`'s prompt (no drafts meanwhile); it is then a decode."""
    scheduler.add(request)
    while not request.is_decode:
        schedule = scheduler.schedule()
        scheduler.postprocess(schedule, [token] * len(schedule.items), [[] for _ in schedule.items])
    return request


def build(scheduler, schedule):
    bucket = BucketPolicy(scheduler.config).bucket_for(schedule)
    batch = build_step(schedule, bucket, block_size=BS, max_blocks=MAX_BLOCKS)
    check_step_inputs(
        batch.inputs,
        block_size=BS,
        chunk_size=4,
        num_blocks=scheduler.config.num_blocks,
        num_slots=scheduler.config.num_slots,
        vocab_size=32,
    )
    return bucket, batch


@pytest.mark.parametrize(
    ("options", "match"),
    [
        (dict(method="eagle"), "method"),
        (dict(num_speculative_tokens=0), "num_speculative_tokens"),
        (dict(num_speculative_tokens=17), "num_speculative_tokens"),
        (dict(prompt_lookup_min=3, prompt_lookup_max=2), "prompt_lookup_max"),
        (dict(prompt_lookup_min=0), "prompt_lookup_min"),
        (dict(draft_model="tiny-mamba2"), "draft_model"),
        (dict(method="draft_model", draft_model=3), "draft_model"),
    ],
)
def test_bad_speculative_config_is_refused(options, match):
    with pytest.raises(ValueError, match=match):
        SpeculativeConfig(**options)


def test_engine_config_sizes_the_slot_pool_for_lanes():
    config = EngineArgs(
        max_num_seqs=8, speculative={"method": "ngram", "num_speculative_tokens": 4}
    )
    assert config.speculative_config == SpeculativeConfig("ngram", 4)
    off = dataclasses.replace(config, prefix_caching="off").resolved(chunk_size=16)
    assert off.num_slots == 1 + 8 * (2 + 4)
    assert EngineArgs(max_num_seqs=8, prefix_caching="off").resolved(16).num_slots == 9
    # The prefix cache's state budget comes on top: max(max_num_seqs, 16) by default.
    assert config.resolved(chunk_size=16).num_slots == 1 + 8 * (2 + 4) + 16
    with pytest.raises(ValueError, match="num_slots"):
        EngineArgs(max_num_seqs=8, num_slots=16, speculative=SpeculativeConfig())
    with pytest.raises(ValueError, match="unknown speculative options"):
        EngineArgs(speculative={"method": "ngram", "k": 2})


def reference_lookup(tokens: list[int], min_n: int, max_n: int, k: int) -> list[int]:
    """Plain loops: the longest suffix (max_n down to min_n) seen earlier; its latest occurrence."""
    for n in range(max_n, min_n - 1, -1):
        if n >= len(tokens):
            continue
        suffix = tokens[-n:]
        for start in range(len(tokens) - n - 1, -1, -1):
            if tokens[start : start + n] == suffix:
                return tokens[start + n : start + n + k]
    return []


@given(
    tokens=st.lists(st.integers(0, 3), min_size=1, max_size=40),
    min_n=st.integers(1, 3),
    extra=st.integers(0, 3),
    k=st.integers(1, 5),
)
def test_lookup_matches_plain_loops(tokens, min_n, extra, k):
    got = lookup(np.array(tokens, np.int32), min_n, min_n + extra, k)
    assert got == reference_lookup(tokens, min_n, min_n + extra, k)


def test_lookup_proposes_what_followed_the_latest_match():
    tokens = np.array([1, 2, 3, 9, 1, 2, 3, 7, 8, 5, 2, 3], np.int32)
    assert lookup(tokens, 1, 3, 3) == [7, 8, 5]  # "2 3" (no "5 2 3" earlier): latest is at 5
    assert lookup(tokens, 3, 3, 3) == []


def test_a_speculative_row_writes_fresh_lane_slots_and_keeps_the_accepted_lane():
    scheduler = spec_scheduler(k=3)
    request = decoding(scheduler, make_request(6, max_tokens=10))
    old_slot = request.state_slot
    proposal = {request: [11, 12, 13, 14]}  # more than K: the scheduler takes 3
    schedule = with_drafts(scheduler.schedule(lambda r: len(proposal[r])), proposal)
    (item,) = schedule.decodes
    assert item.num_tokens == 4 and item.token_ids == [5, 11, 12, 13]
    assert len(set(item.lane_slots)) == 4 and old_slot not in item.lane_slots
    bucket, batch = build(scheduler, schedule)
    assert bucket == Bucket(2, 4, 0, 0)  # the smallest decode-row bucket; row 1 is padding
    d = batch.inputs.decode
    assert d.read_slots.tolist() == [old_slot, 0]
    assert d.write_slots.tolist() == [list(item.lane_slots), [0, 0, 0, 0]]
    assert batch.inputs.positions[:4].tolist() == [6, 7, 8, 9]
    assert batch.sampling.counters[:4].tolist() == [1, 2, 3, 4]  # each lane's output index
    assert batch.sample_rows.tolist() == [3]
    scheduler.postprocess(schedule, [7], [[11]])  # d_1 accepted, then the target's 7
    assert request.output_token_ids == [5, 11, 7] and request.num_computed == 8
    assert request.state_slot == item.lane_slots[1] and scheduler.slot_pool.num_used == 1
    schedule = scheduler.schedule(lambda r: 0)  # zero drafts: a plain row, in its own slot
    (item,) = schedule.decodes
    assert item.num_tokens == 1 and item.lane_slots == ()
    assert item.read_slot == item.write_slot == request.state_slot
    _, batch = build(scheduler, schedule)
    assert batch.inputs.decode.write_slots[0, 0] == request.state_slot


def test_drafts_are_trimmed_to_room_budget_slots_and_blocks():
    # room: max_tokens 3 with one output leaves 2 tokens, so 1 draft
    scheduler = spec_scheduler(k=4)
    request = decoding(scheduler, make_request(5, max_tokens=3))
    assert scheduler.schedule(lambda r: 4).decodes[0].num_tokens == 2
    # slots: the minimum pool (1 + 2 x 4) leaves one draft slot beside two requests' lanes
    scheduler = spec_scheduler(k=4, num_slots=9)
    first = decoding(scheduler, make_request(5, max_tokens=10))
    second = decoding(scheduler, make_request(5, max_tokens=10))
    assert scheduler.slot_pool.num_free == 6
    schedule = scheduler.schedule(lambda r: 4)
    assert [d.num_tokens for d in schedule.decodes] == [5, 1]  # the younger row: in place
    assert [d.request for d in schedule.decodes] == [first, second]
    # blocks: 17 blocks of 4 (16 usable, 16 per full-length request); drafts never preempt
    scheduler = spec_scheduler(k=4, num_blocks=17)
    request = decoding(scheduler, make_request(60, max_tokens=4), token=5)  # 15 blocks held
    schedule = scheduler.schedule(lambda r: 4)
    assert schedule.decodes[0].num_tokens == 3 and scheduler.num_preemptions == 0  # 61..63 < 64
    del request
    # budget: a prefill takes what it needs first; drafts get what is left
    scheduler = spec_scheduler(k=4, max_num_batched_tokens=16)
    decoding(scheduler, make_request(3))
    scheduler.add(make_request(13))
    schedule = scheduler.schedule(lambda r: 4)
    assert schedule.prefills[0].num_tokens == 13 and schedule.decodes[0].num_tokens == 3


def test_min_tokens_masks_each_lane_by_its_output_index():
    scheduler = spec_scheduler(k=3)
    request = Request(
        "m", [1, 2, 3], SamplingParams(max_tokens=8, min_tokens=3), seed=0, eos_token_ids=(2,)
    )
    decoding(scheduler, request, token=9)
    schedule = with_drafts(scheduler.schedule(lambda r: 3), {request: [4, 5, 6]})
    _, batch = build(scheduler, schedule)
    assert batch.sampling.num_masked[:4].tolist() == [1, 1, 0, 0]  # outputs 1, 2 < 3 masked
    assert batch.sampling.masked_ids[:2, 0].tolist() == [2, 2]


def test_a_stop_inside_the_accepted_drafts_ends_the_request_there():
    scheduler = spec_scheduler(k=3)
    request = Request("s", [1, 2, 3], SamplingParams(max_tokens=8), seed=0, eos_token_ids=(2,))
    decoding(scheduler, request, token=9)
    schedule = with_drafts(scheduler.schedule(lambda r: 3), {request: [4, 2, 6]})
    finished = scheduler.postprocess(schedule, [8], [[4, 2, 6]])
    assert finished == [request] and request.output_token_ids == [9, 4, 2]
    assert scheduler.slot_pool.num_used == 0 and scheduler.block_pool.num_used == 0


@given(
    num_drafts=st.lists(st.integers(0, 3), min_size=1, max_size=4),
    seed=st.integers(0, 2**16),
    num_prefills=st.integers(0, 2),
)
def test_verified_tokens_take_the_longest_accepted_prefix(num_drafts, seed, num_prefills):
    """Against a loop over the lanes: stop at the first rejected draft; dead lanes ignored."""
    from runtime.core.schedule import Schedule, ScheduledRequest

    width, rng = 4, np.random.default_rng(seed)
    decodes = [ScheduledRequest(None, 0, 1 + k) for k in num_drafts]
    prefills = [ScheduledRequest(None, 0, 5) for _ in range(num_prefills)]
    n = len(decodes) * width + num_prefills
    tokens, accepted = rng.integers(0, 50, n), rng.integers(0, 2, n)
    sample_rows = np.array(
        [r * width + k for r, k in enumerate(num_drafts)]
        + [len(decodes) * width + j for j in range(num_prefills)]
    )
    sampled, drafts, stats = verified_tokens(
        Schedule(decodes, prefills, []), sample_rows, width, tokens, accepted
    )
    for r, k in enumerate(num_drafts):
        a = 0
        while a < k and accepted[r * width + a]:
            a += 1
        assert drafts[r] == tokens[r * width : r * width + a].tolist()
        assert sampled[r] == tokens[r * width + a]
    assert drafts[len(decodes) :] == [[]] * num_prefills
    assert sampled[len(decodes) :] == tokens[len(decodes) * width :].tolist()
    assert (stats.num_rows, stats.num_drafted) == (sum(k > 0 for k in num_drafts), sum(num_drafts))
    assert stats.num_accepted == sum(len(d) for d in drafts)


def planted(batch, **changes):
    return dataclasses.replace(
        batch.inputs, decode=dataclasses.replace(batch.inputs.decode, **changes)
    )


def test_validate_catches_lane_slot_bugs():
    scheduler = spec_scheduler(k=3)
    requests = [decoding(scheduler, make_request(n)) for n in (5, 6)]
    schedule = with_drafts(scheduler.schedule(lambda r: 2), {r: [3, 4] for r in requests})
    _, batch = build(scheduler, schedule)
    d = batch.inputs.decode
    assert d.query_lens.tolist() == [2, 3]  # the older request has 1 token of room left for drafts
    cases = {
        "repeat": (d.write_slots.copy(), (1, 2), d.write_slots[0, 1]),  # another row's lane slot
        "read slot from a lane > 0": (d.write_slots.copy(), (1, 2), d.read_slots[1]),
        "some live lanes": (d.write_slots.copy(), (1, 1), 0),  # a live lane without a slot
        "dead lanes": (d.write_slots.copy(), (0, 3), 7),
    }
    for match, (write_slots, where, value) in cases.items():
        write_slots[where] = value
        with pytest.raises(ValueError, match=match):
            check_step_inputs(planted(batch, write_slots=write_slots), num_slots=32)


def test_a_step_without_drafts_takes_one_lane_per_row():
    """Width 1 + K only when some decode row has a draft: a drafter that finds nothing costs no
    padding lanes. A zero-draft row is a plain decode row: no lanes, its own slot."""
    scheduler = spec_scheduler(k=3)
    first = decoding(scheduler, make_request(6, max_tokens=10))
    second = decoding(scheduler, make_request(5, max_tokens=10))
    policy = BucketPolicy(scheduler.config)
    assert policy.widths == (1, 4)
    assert {b.width for b in policy.decode_buckets()} == {1, 4}
    schedule = scheduler.schedule(lambda r: 0)
    assert [item.num_tokens for item in schedule.decodes] == [1, 1]
    assert all(item.lane_slots == () for item in schedule.decodes)
    assert policy.bucket_for(schedule).width == 1
    scheduler.postprocess(schedule, [7, 7], [[], []])
    proposal = {first: [], second: [11]}
    schedule = with_drafts(scheduler.schedule(lambda r: len(proposal[r])), proposal)
    assert [item.num_tokens for item in schedule.decodes] == [1, 2]
    assert policy.bucket_for(schedule).width == 4
    assert first.state_slot
