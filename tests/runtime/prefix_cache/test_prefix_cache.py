"""Prefix caching on the host (no model): keys, lookups, reference counts, LRU, publication after
the step, align and all scheduling, and hypothesis schedules checked with validate() each step.

The scheduler here feeds a fixed token (5) as every sampled token; whether outputs stay right with
caching is tests/runtime/prefix_cache/test_prefix_caching.py's job (a real model on the device
path).
"""

from __future__ import annotations

import collections
import hashlib
import itertools

import numpy as np
import pytest
from hypothesis import event, given, settings
from hypothesis import strategies as st

from jmamba.step.invariants import check_step_inputs
from runtime.core.buckets import BucketPolicy
from runtime.core.builder import build_step
from runtime.core.engine_args import EngineArgs
from runtime.core.request import Request
from runtime.core.sampling_params import SamplingParams
from runtime.core.schedule import Schedule
from runtime.core.scheduler import Scheduler
from runtime.prefix_cache.cache import Hit, PrefixCacheStats, chain_digest
from tests.runtime.core.test_scheduler import new_scheduler

BS, SBS, CHUNK = 4, 8, 4  # KV block, state block, model chunk (tokens)
_ids = itertools.count()


def caching_scheduler(mode: str = "all", **options) -> Scheduler:
    options = {
        "max_num_seqs": 4,
        "max_num_batched_tokens": 16,
        "max_model_len": 64,
        "block_size": BS,
        "state_block_size": SBS,
        "prefix_caching": mode,
    } | options
    return new_scheduler(EngineArgs(**options), CHUNK)


def request(tokens: list[int], max_tokens: int = 3) -> Request:
    return Request(f"q{next(_ids)}", list(tokens), SamplingParams(max_tokens=max_tokens), seed=0)


def step(scheduler: Scheduler, token: int = 5) -> Schedule:
    """One step, its inputs built and validated against the cache's published entries."""
    schedule = scheduler.schedule()
    if not schedule.is_empty:
        bucket = BucketPolicy(scheduler.config).bucket_for(schedule)
        config, cache = scheduler.config, scheduler.slots.cache
        batch = build_step(
            schedule,
            bucket,
            block_size=BS,
            max_blocks=config.max_blocks_per_seq,
            state_block_size=config.boundary_block_size,
        )
        check_step_inputs(
            batch.inputs,
            block_size=BS,
            chunk_size=CHUNK,
            num_blocks=config.num_blocks,
            num_slots=config.num_slots,
            published_slots=cache.published_slots,
            published_blocks=cache.published_blocks,
        )
    scheduler.postprocess(schedule, [token] * len(schedule.items))
    return schedule


def run_all(scheduler: Scheduler, max_steps: int = 200) -> list[Schedule]:
    schedules = []
    while scheduler.has_unfinished:
        schedules.append(step(scheduler))
        assert len(schedules) < max_steps
    return schedules


def check_ref_counts(scheduler: Scheduler) -> None:
    """Every pool id is referenced exactly by the requests holding it plus the cache, and the
    cache counts the blocks it could evict right."""
    cache = scheduler.slots.cache
    blocks, slots = collections.Counter(), collections.Counter()
    for r in scheduler.running:
        blocks.update(r.block_ids)
        slots.update(s for s in (r.state_slot, scheduler.slots.cached_read(r)) if s)
    blocks.update(cache.published_blocks.tolist())
    slots.update(cache.published_slots.tolist())
    for pool, held in ((scheduler.block_pool, blocks), (scheduler.slot_pool, slots)):
        want = np.zeros(pool.size, np.int32)
        for ident, count in held.items():
            want[ident] = count
        np.testing.assert_array_equal(pool.ref_counts, want, err_msg=pool.name)
    assert cache.num_states <= scheduler.config.max_cached_states
    # Room for new blocks = free ones + cached ones no request holds, counted here by brute force.
    pool = scheduler.block_pool
    room = pool.num_free + sum(pool.ref_counts[b] == 1 for b in cache.published_blocks.tolist())
    assert cache.can_allocate_blocks(room) and not cache.can_allocate_blocks(room + 1)


def test_digests_chain_blake2b_over_int32_ids():
    """d_i = blake2b(d_{i-1} ++ int32 bytes of block i): a block's key names its whole prefix."""
    d0 = hashlib.blake2b(b"", digest_size=16)
    d0.update(np.array([1, 2, 3, 4], np.int32).tobytes())
    assert chain_digest(b"", [1, 2, 3, 4]) == d0.digest()
    assert chain_digest(d0.digest(), [5, 6, 7, 8]) != chain_digest(b"", [5, 6, 7, 8])
    scheduler = caching_scheduler()
    a, b = request([1, 2, 3, 4, 5, 6, 7, 8, 9]), request([9, 2, 3, 4, 5, 6, 7, 8, 9])
    da, db = (scheduler.slots.cache.digests(r, 2) for r in (a, b))
    assert da[0] == d0.digest() and da[1] == chain_digest(da[0], [5, 6, 7, 8])
    assert da[1] != db[1]  # same second block, different first block


def test_hit_starts_after_the_longest_cached_prefix_and_reads_the_cached_slot():
    """B shares A's first 18 tokens: it starts at 16 (a multiple of the state block), reads the
    slot holding A's state at 16, writes its own slot, shares A's 4 KV blocks, and drops its
    reference on the cached slot once that step has run."""
    scheduler = caching_scheduler(max_num_batched_tokens=32)
    shared = list(range(10, 28))
    a, b = request(shared + [1, 2, 3]), request(shared + [4, 5, 6, 7])
    scheduler.add(a)
    run_all(scheduler)
    cache = scheduler.slots.cache
    slot_16 = cache._states[cache.state_key(a, 16)]
    scheduler.add(b)
    schedule = step(scheduler)
    (item,) = schedule.prefills
    assert (item.start, item.num_tokens, item.read_slot) == (16, 6, slot_16)
    assert item.write_slot == b.state_slot != slot_16
    assert b.block_ids[:4] == [cache._blocks[d] for d in cache.digests(a, 4)]
    assert scheduler.slots.cached_read(b) == 0 and scheduler.slot_pool.ref_counts[slot_16] == 1
    assert cache.stats.hits == 1 and cache.stats.hit_tokens == 16
    check_ref_counts(scheduler)


def test_a_full_prompt_hit_still_computes_the_last_token():
    """A repeated prompt of 17 tokens hits 16 and feeds the 17th (its logits give the token)."""
    scheduler = caching_scheduler()
    prompt = list(range(30, 47))
    scheduler.add(request(prompt))
    run_all(scheduler)
    again = request(prompt)
    scheduler.add(again)
    (item,) = step(scheduler).prefills
    assert (item.start, item.num_tokens) == (16, 1) and again.output_token_ids == [5]


def test_nothing_is_published_before_its_step_has_run():
    """States a step will write are reserved, not published: a lookup in between misses them, and
    a step that never runs (its schedule dropped) publishes nothing (vLLM #56525)."""
    scheduler = caching_scheduler(max_num_batched_tokens=32)
    prompt = list(range(1, 20))
    scheduler.add(request(prompt))
    schedule = scheduler.schedule()
    assert [len(s.new_states) for s in schedule.prefills] == [2]  # boundaries 8 and 16
    assert scheduler.slots.cache.lookup(request(prompt)).num_tokens == 0
    assert scheduler.slots.cache.published_slots.size == 0
    scheduler.postprocess(schedule, [5])
    assert scheduler.slots.cache.lookup(request(prompt)).num_tokens == 16


def test_align_mode_cuts_chunks_at_state_blocks_and_caches_only_chunk_ends():
    """A 21-token prompt under a 20-token budget: chunks [0, 16) (a multiple of 8 under the
    budget) and [16, 21) (the tail); only the state at 16 is cached. In "all" mode the same
    prompt runs as [0, 20) + [20, 21) (chunk 4) and caches 8 and 16."""
    for mode, cuts, cached in (("align", [16, 5], [16]), ("all", [20, 1], [8, 16])):
        scheduler = caching_scheduler(mode, max_num_batched_tokens=20)
        r = request(list(range(50, 71)))
        scheduler.add(r)
        schedules = run_all(scheduler)
        assert [s.prefills[0].num_tokens for s in schedules[:2]] == cuts, mode
        keys = {scheduler.slots.cache.state_key(r, p): p for p in (8, 16)}
        assert sorted(keys[k] for k in scheduler.slots.cache._states) == cached, mode


def test_align_mode_tail_is_its_own_chunk_even_when_the_prompt_fits():
    """11 tokens, budget 16: [0, 8) then [8, 11), so the state at 8 is a chunk end."""
    scheduler = caching_scheduler("align")
    scheduler.add(request(list(range(11))))
    assert [s.prefills[0].num_tokens for s in run_all(scheduler)[:2]] == [8, 3]


def test_decode_crossing_a_boundary_writes_a_cache_slot_then_reads_it():
    """Mode "all": the decode step feeding token 15 ends on the boundary at 16: it writes its state
    to a fresh cache slot c (not its own), c is published after the step, and the next step reads c
    and writes the request's own slot; then c is only the cache's."""
    scheduler = caching_scheduler()
    r = request(list(range(60, 74)), max_tokens=6)  # 14 prompt tokens: decodes feed 14, 15, ...
    scheduler.add(r)
    step(scheduler)  # prefill [0, 14)
    step(scheduler)  # decode of token 14
    crossing = step(scheduler).decodes[0]  # decode of token 15
    assert crossing.start == 15 and crossing.write_slot not in (0, r.state_slot)
    c = crossing.write_slot
    assert scheduler.slots.cached_read(r) == c and scheduler.slots.cache.lookup(
        request(r.token_ids(0, 17))
    ) == Hit(16, [scheduler.slots.cache._blocks[d] for d in scheduler.slots.cache.digests(r, 4)], c)
    after = step(scheduler).decodes[0]
    assert (after.read_slot, after.write_slot) == (c, r.state_slot)
    assert scheduler.slots.cached_read(r) == 0 and scheduler.slot_pool.ref_counts[c] == 1
    check_ref_counts(scheduler)


def test_an_asynchronous_decode_crossing_a_boundary_is_keyed_when_it_retires():
    """Asynchronous order (schedule N + 1, retire N, advance N + 1): the decode feeding token 15
    is scheduled while token 15 is still pending, so it writes a fresh cache slot c with no key;
    retiring it publishes c under the key of tokens [0, 16), and the next step reads c."""
    scheduler = caching_scheduler(async_scheduling=True)
    r = request(list(range(60, 74)), max_tokens=6)  # 14 prompt tokens: decodes feed 14, 15, ...
    scheduler.add(r)
    in_flight = scheduler.schedule()  # prefill [0, 14)
    scheduler.advance(in_flight)
    crossing = None
    while crossing is None or in_flight.decodes[0] is not crossing:
        launched = scheduler.schedule()
        if launched.decodes and launched.decodes[0].start == 15:
            crossing = launched.decodes[0]
            assert r.num_pending == 1 and crossing.new_states == ((None, crossing.write_slot),)
            assert crossing.write_slot not in (0, r.state_slot)
        scheduler.retire(in_flight, [5] * len(in_flight.items))
        scheduler.advance(launched)
        in_flight = launched
    c = crossing.write_slot
    turn2 = request(r.token_ids(0, 16) + [1])
    assert scheduler.slots.cache.lookup(turn2).num_tokens == 8  # not published before it ran
    after = scheduler.schedule().decodes[0]
    scheduler.retire(in_flight, [5])
    assert (after.read_slot, after.write_slot) == (c, r.state_slot)
    key = scheduler.slots.cache.state_key(r, 16)
    assert scheduler.slots.cache.published_states[key] == c
    hit = scheduler.slots.cache.lookup(turn2)
    assert (hit.num_tokens, hit.slot) == (16, c)
    check_ref_counts(scheduler)


def test_state_budget_evicts_least_recently_used_unused_states():
    """max_cached_states=2: a third state evicts the least recently used one no request reads;
    with every cached state in use, nothing is cached (NULL boundary slot) instead."""
    scheduler = caching_scheduler(max_cached_states=2, max_num_batched_tokens=32)
    prompts = [[k] * 9 for k in (1, 2, 3)]  # each caches its state at 8
    for p in prompts:
        scheduler.add(request(p))
        run_all(scheduler)
    cache = scheduler.slots.cache
    assert cache.stats.state_evictions == 1 and cache.num_states == 2
    assert cache.lookup(request(prompts[0])).num_tokens == 0  # the oldest went
    assert cache.lookup(request(prompts[2])).num_tokens == 8
    # Two requests hold (read) both cached states in one step: a new state has no room.
    for p in prompts[1:]:
        scheduler.add(request(p))
    scheduler.add(request([4] * 9))
    schedule = scheduler.schedule()
    assert [s.start for s in schedule.prefills] == [8, 8, 0]
    assert schedule.prefills[2].boundary_slots == (0,) and not schedule.prefills[2].new_states
    scheduler.postprocess(schedule, [5] * 3)
    check_ref_counts(scheduler)


def test_cached_blocks_are_evicted_before_anyone_is_preempted():
    """9 usable blocks: after A finishes, 4 of them are cached; B needs 6: LRU cached blocks are
    evicted (the deepest of A's prefix first), nothing is preempted."""
    scheduler = caching_scheduler(num_blocks=10, max_model_len=32, max_num_batched_tokens=32)
    a = request(list(range(100, 118)), max_tokens=2)
    scheduler.add(a)
    run_all(scheduler)
    assert scheduler.block_pool.num_free == 9 - 4  # 18 + 1 computed tokens fill 4 blocks
    scheduler.add(request(list(range(200, 221)), max_tokens=4))  # 24 tokens computed: 6 blocks
    assert not any(s.preempted for s in run_all(scheduler))
    cache = scheduler.slots.cache
    assert cache.stats.block_evictions == 1
    assert cache.digests(a, 4)[3] not in cache._blocks and cache.digests(a, 3)[2] in cache._blocks
    check_ref_counts(scheduler)


def test_preempted_request_comes_back_with_a_hit_and_leaks_nothing():
    """13 usable blocks, two requests growing to 9 and 11: the younger one is preempted at about
    7 blocks; the older needs 2 more, evicted from the deep end of the preempted one's cached
    prefix, so when the younger is re-admitted it starts after its own first blocks and state.
    Afterwards, with the cache emptied, every pool is empty."""
    scheduler = caching_scheduler(
        num_blocks=14, max_model_len=48, max_num_batched_tokens=32, max_cached_states=8
    )
    old, new = request(list(range(20)), max_tokens=14), request(list(range(40, 60)), max_tokens=24)
    scheduler.add(old)
    scheduler.add(new)
    schedules = run_all(scheduler)
    assert new.num_preemptions == 1
    after = schedules[next(i for i, s in enumerate(schedules) if new in s.preempted) + 1 :]
    first = next(i for s in after for i in s.prefills if i.request is new)
    assert first.start == 16 and first.read_slot not in (0, new.state_slot)  # its own prefix
    check_ref_counts(scheduler)
    scheduler.slots.cache.reset()
    assert scheduler.block_pool.num_used == 0 and scheduler.slot_pool.num_used == 0


@pytest.mark.parametrize(
    "options, message",
    [
        (dict(prefix_caching="some"), "prefix_caching='some' must be one of"),
        (dict(state_block_size=6), "state_block_size=6 must be a multiple of block_size=4"),
        (dict(state_block_size=12, chunk=8), "state_block_size=12 must be a multiple of the model"),
        (dict(max_cached_states=0), "cannot work: max_cached_states=0"),
        (dict(num_slots=6), "cannot work: max_cached_states=1 leaves|cannot work: num_slots=6"),
        (dict(state_block_size=64), r"cannot work: state_block_size=64 > max_model_len - 2"),
        (dict(prefix_caching="align", state_block_size=16), "must be >= chunk_size \\+ "),
    ],
)
def test_modes_that_cannot_work_are_refused_with_the_reason(options, message):
    options = {"prefix_caching": "all"} | options
    chunk = options.pop("chunk", CHUNK)
    config = {
        "max_num_seqs": 4,
        "max_num_batched_tokens": 16,
        "max_model_len": 64,
        "block_size": BS,
    } | options
    if options.get("num_slots") == 6:  # 6 slots hold 4 running requests + NULL + 1 state
        config["max_cached_states"] = 2
    with pytest.raises(ValueError, match=message):
        new_scheduler(EngineArgs(**config), chunk)


def test_default_mode_and_sizes():
    """No mode named: "all" where it can work, "off" where it cannot (explicit num_slots with no
    room, or a state block too long for max_model_len); the slot pool grows by the state budget,
    max(max_num_seqs, 16)."""
    resolved = EngineArgs(max_num_seqs=8).resolved(16)
    assert (resolved.prefix_caching, resolved.state_block_size) == ("all", 16)
    assert (resolved.max_cached_states, resolved.num_slots) == (16, 25)
    assert EngineArgs.of_config(resolved).resolved(16) == resolved
    assert EngineArgs(max_num_seqs=32).resolved(16).num_slots == 65
    assert EngineArgs(max_num_seqs=4, num_slots=5).resolved(16).prefix_caching == "off"
    small = EngineArgs(max_model_len=64, block_size=8).resolved(64)
    assert (small.prefix_caching, small.num_slots) == ("off", 9)
    off = EngineArgs(prefix_caching="off").resolved(16)
    assert (off.max_cached_states, off.num_slots, off.boundary_block_size) == (0, 9, 0)


shared_workload = st.lists(
    st.tuples(
        st.integers(0, 3),  # which of 4 shared prefixes
        st.sampled_from([8, 9, 17, 25, 30]) | st.integers(0, 30),  # how much of it (tokens)
        st.integers(0, 12),  # own tokens after it
        st.integers(1, 10),  # max_tokens
        st.integers(0, 8),  # arrival step
        st.none() | st.integers(0, 12),  # abort step
    ),
    min_size=1,
    max_size=10,
)


@settings(max_examples=4 * settings.default.max_examples)
@given(
    workload=shared_workload,
    mode=st.sampled_from(["align", "all"]),
    num_blocks=st.integers(17, 28),  # few blocks: eviction and preemption
    max_cached_states=st.integers(1, 6),
    budget=st.integers(16, 40),
)
def test_random_shared_prefix_schedules(workload, mode, num_blocks, max_cached_states, budget):
    """Random prefixes, arrivals, aborts and pool sizes: every step's inputs pass validate() with
    the published slots and blocks (no write to one), reference counts always match the holders,
    every request finishes, hits happen, and an emptied cache leaves empty pools."""
    scheduler = caching_scheduler(
        mode,
        num_blocks=num_blocks,
        max_cached_states=max_cached_states,
        max_num_batched_tokens=budget,
    )
    rng = np.random.default_rng(len(workload))
    prefixes = [rng.integers(0, 50, 30).tolist() for _ in range(4)]
    requests = []
    for k, shared, own, max_tokens, _, _ in workload:
        tokens = prefixes[k][:shared] + rng.integers(50, 99, own).tolist()
        requests.append(request(tokens or [7], max_tokens))
    for t in itertools.count():
        for r, (*_, arrival, abort) in zip(requests, workload, strict=True):
            if arrival == t:
                scheduler.add(r)
            if abort == t:
                scheduler.abort(r.request_id)
        step(scheduler)
        check_ref_counts(scheduler)
        if t > 8 and not scheduler.has_unfinished:
            break
        assert t < 400
    assert all(r.is_finished for r in requests)
    stats = scheduler.slots.cache.stats
    event(f"hits: {'some' if stats.hits else 'none'}")
    event("preempted" if any(r.num_preemptions for r in requests) else "no preemption")
    scheduler.slots.cache.reset()
    assert scheduler.block_pool.num_used == 0 and scheduler.slot_pool.num_used == 0


def test_stats_total_sums_every_counter_over_ranks():
    one = PrefixCacheStats(lookups=2, lookup_tokens=80, hits=1, hit_tokens=32, state_evictions=3)
    two = PrefixCacheStats(lookups=1, lookup_tokens=8, block_evictions=4, states_published=5)
    total = PrefixCacheStats.total([one, two])
    assert total == PrefixCacheStats(
        lookups=3,
        lookup_tokens=88,
        hits=1,
        hit_tokens=32,
        states_published=5,
        block_evictions=4,
        state_evictions=3,
    )
    assert total.token_hit_rate == 32 / 88
