"""Hypothesis-driven schedules: validate() on every step and batch invariance at the end."""

from __future__ import annotations

import functools

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from runtime.sampling_params import SamplingParams
from tests.runtime.conftest import make_engine, run_to_completion

FAMILY = "nemotron_h"  # attention + Mamba2 + MoE: both pools and the MoE routing are exercised

request_strategy = st.fixed_dictionaries(
    {
        "arrival": st.integers(0, 6),
        "prompt_len": st.integers(1, 40),
        "max_tokens": st.integers(1, 8),
        "abort_at": st.none() | st.integers(0, 10),
        "seed": st.integers(0, 2**16),
    }
)


@functools.cache
def isolated_tokens(prompt: tuple[int, ...], max_tokens: int) -> list[int]:
    """The request served alone (no chunking pressure, no preemption)."""
    engine = make_engine(FAMILY)
    request_id = engine.add_request(list(prompt), SamplingParams(max_tokens=max_tokens))
    return run_to_completion(engine)[request_id]


@settings(max_examples=8)
@given(
    requests=st.lists(request_strategy, min_size=1, max_size=6),
    budget=st.sampled_from([16, 24, 32]),
    max_num_seqs=st.integers(1, 4),
)
def test_random_schedule_is_valid_and_batch_invariant(requests, budget, max_num_seqs):
    """Arrivals, aborts, small pools (preemption), varied budgets: every request == isolated run."""
    engine = make_engine(FAMILY, max_num_batched_tokens=budget, max_num_seqs=max_num_seqs)
    prompts = [
        tuple(np.random.default_rng(r["seed"]).integers(0, 256, r["prompt_len"]).tolist())
        for r in requests
    ]
    outputs, aborted, step = {}, set(), 0
    while step <= 6 or engine.has_unfinished:
        for i, r in enumerate(requests):
            if r["arrival"] == step:
                engine.add_request(list(prompts[i]), SamplingParams(max_tokens=r["max_tokens"]),
                                   request_id=str(i))  # fmt: skip
            if r["abort_at"] == step and engine.abort(str(i)) is not None:
                aborted.add(str(i))
        outputs |= {o.request_id: o for o in engine.step()}  # validate_inputs is on
        step += 1
        assert step < 400
    assert engine.scheduler.block_pool.num_used == 0 and engine.scheduler.slot_pool.num_used == 0
    for i, r in enumerate(requests):
        if str(i) not in aborted:
            assert outputs[str(i)].token_ids == isolated_tokens(prompts[i], r["max_tokens"]), i
