"""Scheduler decisions on plain requests: admission, chunking, classification, preemption, abort."""

from __future__ import annotations

import itertools

import pytest

from runtime.core.engine_args import EngineArgs
from runtime.core.request import Request, RequestStatus
from runtime.core.sampling_params import SamplingParams
from runtime.core.scheduler import Scheduler
from runtime.prefix_cache import slot_planner

_ids = itertools.count()


def make_request(num_prompt: int, max_tokens: int = 4) -> Request:
    prompt = [1 + i % 7 for i in range(num_prompt)]
    return Request(f"r{next(_ids)}", prompt, SamplingParams(max_tokens=max_tokens), seed=0)


def new_scheduler(config: EngineArgs, chunk_size: int) -> Scheduler:
    """A scheduler of `config` for a model of `chunk_size` with attention and recurrent layers,
    with the slot planner the config asks for (as an engine builds its ranks)."""
    config = config.resolved(chunk_size)
    return Scheduler(config, slot_planner(config, uses_blocks=True, uses_slots=True))


def make_scheduler(chunk_size: int = 4, **options) -> Scheduler:
    """A scheduler without prefix caching unless `options` turn it on (tests/runtime/
    test_prefix_cache.py covers it), so pools empty out when requests finish."""
    options = {
        "max_num_seqs": 4,
        "max_num_batched_tokens": 16,
        "max_model_len": 64,
        "block_size": 4,
        "prefix_caching": "off",
    } | options
    return new_scheduler(EngineArgs(**options), chunk_size)


def run_step(scheduler: Scheduler, token: int = 5):
    schedule = scheduler.schedule()
    finished = scheduler.postprocess(schedule, [token] * len(schedule.items))
    return schedule, finished


def test_chunks_end_on_chunk_multiples_unless_prompt_ends():
    """A 23-token prompt under a 10-token budget is fed as 8 + 8 + 7 (chunk size 4)."""
    scheduler = make_scheduler(max_num_batched_tokens=10)
    request = make_request(23)
    scheduler.add(request)
    lengths = []
    for _ in range(3):
        schedule, _ = run_step(scheduler)
        assert [s.request for s in schedule.prefills] == [request] and not schedule.decodes
        lengths.append(schedule.prefills[0].num_tokens)
    assert lengths == [8, 8, 7]
    assert request.output_token_ids == [5]  # only the last chunk samples


def test_one_token_prompt_is_a_prefill_then_decodes():
    """A first chunk is always a prefill, even of one token; afterwards the request decodes."""
    scheduler = make_scheduler()
    request = make_request(1, max_tokens=3)
    scheduler.add(request)
    schedule, _ = run_step(scheduler)
    assert len(schedule.prefills) == 1 and not schedule.decodes
    schedule, _ = run_step(scheduler)
    assert len(schedule.decodes) == 1 and not schedule.prefills
    assert schedule.decodes[0].start == 1 and schedule.decodes[0].token_ids == [5]


def test_max_num_seqs_and_budget_limit_admission():
    """At most max_num_seqs rows, and prefill tokens never exceed the token budget."""
    scheduler = make_scheduler(max_num_seqs=2, max_num_batched_tokens=12)
    for _ in range(4):
        scheduler.add(make_request(5))
    schedule = scheduler.schedule()
    assert len(schedule.prefills) == 2
    assert sum(s.num_tokens for s in schedule.items) <= 12


def test_slots_and_blocks_are_distinct_and_never_null():
    """Running requests hold distinct non-NULL slots and blocks."""
    scheduler = make_scheduler()
    for n in (3, 9, 4):
        scheduler.add(make_request(n))
    run_step(scheduler)
    slots = [r.state_slot for r in scheduler.running]
    blocks = [b for r in scheduler.running for b in r.block_ids]
    assert 0 not in slots and len(set(slots)) == len(slots)
    assert 0 not in blocks and len(set(blocks)) == len(blocks)


def test_preemption_when_blocks_run_out_then_recompute():
    """With too few blocks the newest request is preempted, later recomputes prompt + output."""
    scheduler = make_scheduler(num_blocks=17, max_model_len=64, block_size=4)
    old, new = make_request(16, max_tokens=40), make_request(16, max_tokens=40)
    scheduler.add(old)
    scheduler.add(new)
    preempted = []
    for _ in range(30):
        schedule, _ = run_step(scheduler)
        preempted += schedule.preempted
        if preempted:
            break
    assert preempted == [new] and new.status is RequestStatus.WAITING
    assert new.num_computed == 0 and new.block_ids == [] and new.state_slot == 0
    assert new.num_prefill_tokens == 16 + len(new.output_token_ids)
    assert scheduler.waiting[0] is new


def test_finish_frees_everything():
    """After max_tokens the request finishes and its blocks and slot return to the pools."""
    scheduler = make_scheduler()
    request = make_request(6, max_tokens=2)
    scheduler.add(request)
    finished = []
    for _ in range(3):
        finished += run_step(scheduler)[1]
    assert finished == [request] and request.finish_reason.value == "length"
    assert scheduler.block_pool.num_used == 0 and scheduler.slot_pool.num_used == 0


def test_stop_token_finishes():
    scheduler = make_scheduler()
    request = Request("s", [1, 2], SamplingParams(max_tokens=9, stop_token_ids=(5,)), seed=0)
    scheduler.add(request)
    _, finished = run_step(scheduler, token=5)
    assert finished == [request] and request.finish_reason.value == "stop"


def test_abort_waiting_and_running():
    """Abort frees a running request's pool entries and drops a waiting one."""
    scheduler = make_scheduler(max_num_seqs=1)
    running, waiting = make_request(4), make_request(4)
    scheduler.add(running)
    scheduler.add(waiting)
    run_step(scheduler)
    assert scheduler.abort(running.request_id) is running
    assert scheduler.abort(waiting.request_id) is waiting
    assert scheduler.abort("nope") is None
    assert not scheduler.has_unfinished and scheduler.block_pool.num_used == 0
    assert running.finish_reason.value == "abort"


def test_prompt_advances_beside_a_full_decode_batch():
    """The issue's case, at the smallest allowed budget (chunk 16 + 3 decode lanes): a 20-token
    prompt behind three decodes gets 16 tokens, then 4, and its first token in its second step."""
    scheduler = make_scheduler(chunk_size=16, max_num_batched_tokens=19)
    decoding = [make_request(2, max_tokens=40) for _ in range(3)]
    for request in decoding:
        scheduler.add(request)
    run_step(scheduler)
    prompt = make_request(20)
    scheduler.add(prompt)
    chunks = []
    while not prompt.output_token_ids:
        schedule, _ = run_step(scheduler)
        assert [s.request for s in schedule.decodes] == decoding  # decodes never wait either
        chunks += [s.num_tokens for s in schedule.prefills]
    assert chunks == [16, 4]


def test_a_budget_without_room_for_a_chunk_beside_the_decodes_is_refused():
    with pytest.raises(ValueError, match=r"max_num_batched_tokens=18 must be >= chunk_size \+ "):
        make_scheduler(chunk_size=16, max_num_batched_tokens=18)


def test_default_budget_is_derived_from_the_chunk_size():
    """None: the smallest power of two >= max(256, chunk + max_num_seqs - 1)."""
    config = EngineArgs(max_num_seqs=8)
    assert config.max_num_batched_tokens is None and config.prefill_token_buckets is None
    assert config.resolved(16).max_num_batched_tokens == 256  # the tiny presets
    assert config.resolved(128).max_num_batched_tokens == 256  # NemotronH
    resolved = config.resolved(256)  # Mamba2
    assert resolved.max_num_batched_tokens == 512 and resolved.prefill_token_buckets[-1] == 512
    scheduler = new_scheduler(config, 256)
    assert scheduler.budget == 512


def test_a_request_that_cannot_get_a_chunk_does_not_block_the_ones_behind():
    """Head-of-line: a long prompt that cannot get a chunk of the 2 tokens left keeps its row;
    a 2-token prompt behind it is admitted with them; a third request finds no row left."""
    scheduler = make_scheduler(chunk_size=16, max_num_seqs=3, max_num_batched_tokens=18)
    running = make_request(40)
    scheduler.add(running)
    run_step(scheduler)  # 16 tokens
    long, short, third = make_request(40), make_request(2), make_request(1)
    for request in (long, short, third):
        scheduler.add(request)
    schedule = scheduler.schedule()
    assert [(s.request, s.num_tokens) for s in schedule.prefills] == [(running, 16), (short, 2)]
    assert scheduler.waiting == [long, third]
    scheduler.postprocess(schedule, [5, 5])
    run_step(scheduler)  # `running` finishes its prompt (8 tokens): 10 tokens left
    schedule = scheduler.schedule()  # the long one is oldest now and gets its chunk
    assert [(s.request, s.num_tokens) for s in schedule.prefills] == [(long, 16)]


def test_stop_tokens_wait_for_min_tokens():
    """A stop id before min_tokens generated tokens does not stop (the sampler masks it; here
    the scheduler is fed it anyway); after that it does. EOS ids stop unless ignored."""
    scheduler = make_scheduler()
    params = SamplingParams(max_tokens=9, min_tokens=2, stop_token_ids=(5,))
    request = Request("m", [1, 2], params, seed=0, eos_token_ids=(6,))
    ignoring = Request(
        "i", [1, 2], SamplingParams(max_tokens=3, ignore_eos=True), seed=0, eos_token_ids=(6,)
    )
    scheduler.add(request)
    scheduler.add(ignoring)
    assert request.stop_ids == (5, 6) and ignoring.stop_ids == ()
    assert request.masked_token_ids == (5, 6)
    finished = [run_step(scheduler, token=6)[1] for _ in range(3)]
    assert finished == [[], [], [request, ignoring]]
    assert request.finish_reason.value == "stop" and request.output_token_ids == [6, 6, 6]
    assert ignoring.finish_reason.value == "length" and request.masked_token_ids == ()


def test_output_never_passes_max_model_len():
    """A prompt of max_model_len - 1 tokens gets one token, whatever max_tokens asks."""
    scheduler = make_scheduler(max_model_len=16)
    request = make_request(15, max_tokens=10)
    scheduler.add(request)
    finished = []
    while not finished:
        finished = run_step(scheduler)[1]
    assert request.output_token_ids == [5] and request.finish_reason.value == "length"
