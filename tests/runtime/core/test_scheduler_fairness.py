"""Fairness of the scheduler on random workloads (plain Python, no model): a bound on every
request's wait for its first token, the per-step progress of the oldest prefill it rests on, and
no request left unserved that the step had room for (no head-of-line blocking). With and without
prefix caching: "align" aligns chunks to the state block, and every prompt here is all ones, so
"align" and "all" hit often (a hit only shortens a prompt)."""

from __future__ import annotations

import math

from hypothesis import given, settings
from hypothesis import strategies as st

from runtime.core.budgets import min_token_budget
from runtime.core.engine_args import EngineArgs
from runtime.core.request import Request
from runtime.core.sampling_params import SamplingParams
from runtime.core.schedule import Schedule
from runtime.core.scheduler import Scheduler
from tests.runtime.core.test_scheduler import new_scheduler

workload = st.lists(
    st.tuples(
        st.integers(0, 12),  # arrival step
        st.integers(1, 70),  # prompt length
        st.integers(1, 12),  # max_tokens
    ),
    min_size=1,
    max_size=8,
).map(lambda requests: sorted(requests, key=lambda r: r[0]))  # stable: added in list order


def first_token_bound(
    index: int, requests: list[tuple[int, int, int]], first: list[int], k_chunk: int, tail: int
) -> int:
    """Steps from request `index`'s arrival to its first token (arrival step included), at most.

    Derivation (the argument is in the scheduler's module docstring): with a budget
    B >= c + S - 1 and rows, slots and blocks for every request, each step the oldest request
    still prefilling either finishes its prompt or advances by at least k*c tokens,
    k = (B - S + 1) // c >= 1, and requests that arrived later never delay it. So the requests j
    added no later than `index` (itself included) that had no first token yet when it arrived are
    done, oldest first, within sum_j ceil(L_j / (k*c)) steps, L_j their prompt lengths. In
    "align" mode c is the state block and each request may take `tail` = 1 more step: its last
    tokens after the last state block boundary are a chunk of their own.
    """
    arrival = requests[index][0]
    return sum(
        math.ceil(length / k_chunk) + tail
        for j, (_, length, _) in enumerate(requests[: index + 1])
        if first[j] >= arrival
    )


def assert_nothing_servable_left(scheduler: Scheduler, schedule: Schedule, left: int) -> None:
    """Work conservation: with `left` tokens unused, no running prefill went unserved and no
    waiting request was kept out, unless it needs more than `left` and `left` is under a chunk
    (each older waiting request keeps a row for itself)."""
    chunk = scheduler.alignment
    served = {item.request for item in schedule.items}
    for request in scheduler.running:
        remaining = request.num_prefill_tokens - request.num_computed
        if request not in served and not request.is_decode:
            assert left < chunk and remaining > left, (remaining, left)
    free_rows = scheduler.config.max_num_seqs - len(scheduler.running)
    for position, request in enumerate(scheduler.waiting):
        servable = request.num_prefill_tokens <= left or left >= chunk
        assert not (servable and position < free_rows), (position, request.num_prefill_tokens)


@settings(max_examples=10 * settings.default.max_examples)
@given(
    requests=workload,
    chunk=st.sampled_from([1, 2, 4, 8, 16]),
    spare_rows=st.integers(0, 3),
    extra_budget=st.integers(0, 40),
    mode=st.sampled_from(["off", "align", "all"]),
)
def test_every_request_gets_its_first_token_within_the_bound(
    requests, chunk, spare_rows, extra_budget, mode
):
    """Rows, slots and blocks for every request (max_num_seqs >= number of requests)."""
    max_num_seqs = len(requests) + spare_rows
    state_block = math.lcm(chunk, 4)
    unit = state_block if mode == "align" else chunk  # the alignment of chunk ends
    budget = min_token_budget(unit, max_num_seqs) + extra_budget
    config = EngineArgs(
        max_num_seqs=max_num_seqs,
        max_num_batched_tokens=budget,
        max_model_len=128,
        block_size=4,
        prefix_caching=mode,
        state_block_size=state_block,
    )
    scheduler = new_scheduler(config, chunk)
    k_chunk = (budget - max_num_seqs + 1) // unit * unit  # k * c of the bound
    added: list[Request] = []
    first_step: dict[Request, int] = {}
    step = 0
    while len(added) < len(requests) or scheduler.has_unfinished:
        for arrival, length, max_tokens in requests[len(added) :]:
            if arrival == step:
                added.append(
                    Request(str(len(added)), [1] * length, SamplingParams(max_tokens), seed=0)
                )
                scheduler.add(added[-1])
        oldest = next((r for r in added if not r.is_decode and not r.is_finished), None)
        done_before = oldest.num_computed if oldest else 0
        schedule = scheduler.schedule()
        assert not schedule.preempted and len(schedule.items) <= max_num_seqs
        left = budget - len(schedule.decodes) - schedule.num_prefill_tokens
        assert left >= 0
        assert_nothing_servable_left(scheduler, schedule, left)
        scheduler.postprocess(schedule, [5] * len(schedule.items))
        if oldest is not None:  # the step of the derivation below
            end = oldest.num_prefill_tokens
            if mode == "align" and done_before < end // unit * unit:
                end = end // unit * unit  # "align" stops at the last boundary first
            wanted = min(end - done_before, k_chunk)
            assert oldest.num_computed - done_before >= wanted, (step, oldest.request_id)
        for request in added:
            if request.output_token_ids:
                first_step.setdefault(request, step)
        step += 1
        assert step < 2000
    first = [first_step[request] for request in added]
    for index, (arrival, _, _) in enumerate(requests):
        waited = first[index] - arrival + 1
        tail = 1 if mode == "align" else 0
        assert waited <= first_token_bound(index, requests, first, k_chunk, tail), index
