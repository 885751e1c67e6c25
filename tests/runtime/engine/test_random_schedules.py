"""Hypothesis-driven schedules on every family: validate() on every step, batch invariance, stops.

Each example draws arrivals, aborts, prompt lengths, budgets, max_num_seqs (small pools force
preemption), per-request stop tokens, `min_tokens` and `ignore_eos`, and an EOS id for the engine.
Stop and EOS ids are picked from what the model greedily generates, so stops really happen.
Checked: every request's output equals the request served alone (batch invariance), and the
served-alone output obeys the stopping rules against the unconstrained greedy output.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import event, given, settings
from hypothesis import strategies as st

import jmamba
from runtime.core.budgets import min_token_budget
from runtime.core.sampling_params import SamplingParams
from runtime.outputs.request_output import RequestOutput
from tests.compiled import per_module
from tests.runtime.conftest import DECODE_STEPS, base_config, make_engine, naive_greedy
from tests.tiers import quick_first

FAMILIES = ("mamba2", "nemotron_h", "qwen3_next")

request_strategy = st.fixed_dictionaries(
    {
        "arrival": st.integers(0, 4),
        # Short and long prompts (+ max_tokens <= MAX_MODEL_LEN): long ones exhaust the 12 KV
        # blocks (96 tokens) and force preemption.
        "prompt_len": st.integers(1, 8) | st.integers(24, 56),
        "max_tokens": st.integers(1, 8),
        "min_tokens": st.integers(0, 8),  # clipped to max_tokens
        "ignore_eos": st.booleans(),
        "stop_at": st.none() | st.integers(0, 7),  # stop id: the unconstrained output's token
        "abort_at": st.none() | st.integers(0, 10),
        "seed": st.integers(0, 2**16),
    }
)


@per_module
def served_alone(
    family: str, prompt: tuple[int, ...], params: SamplingParams, eos: tuple[int, ...]
) -> RequestOutput:
    """The request on a fresh engine with nothing else to serve."""
    engine = make_engine(family, eos_token_ids=eos)
    request_id = engine.add_request(list(prompt), params)
    outputs = {}
    while engine.has_unfinished:
        outputs |= {o.request_id: o for o in engine.step()}
    return outputs[request_id]


@per_module
def unconstrained(family: str, prompt: tuple[int, ...], max_tokens: int) -> list[int]:
    """Greedy tokens with no stop token at all, by full recompute (independent of the engine)."""
    return naive_greedy(family, list(prompt), max_tokens, stop_ids=())


def check_stopping(output: RequestOutput, free: list[int], params, stop_ids: set[int]) -> None:
    """`output` against `free`, the same request's unconstrained greedy output.

    Before the first stop token of `free` greedy decoding is unaffected by masking, so the output
    follows `free` up to there; a stop token at an index >= min_tokens ends it ("stop"); one at
    an index < min_tokens is masked, so the output differs there and holds no stop token before
    min_tokens.
    """
    tokens, m = output.token_ids, params.min_tokens
    first = next((i for i, t in enumerate(free) if t in stop_ids), None)
    masked = first is not None and first < m
    event(
        f"finish {output.finish_reason}" + (" after a stop masked by min_tokens" if masked else "")
    )
    if first is None or first >= m:
        expected = free if first is None else free[: first + 1]
        reason = "length" if first is None else "stop"
        assert (tokens, output.finish_reason) == (expected, reason)
        return
    assert tokens[:first] == free[:first] and tokens[first] not in stop_ids
    assert not stop_ids & set(tokens[:m])
    if output.finish_reason == "stop":
        assert tokens[-1] in stop_ids and len(tokens) > m
    else:
        assert output.finish_reason == "length" and len(tokens) == params.max_tokens


def drawn_workload(
    family: str, requests: list[dict], extra_budget: int, max_num_seqs: int, eos_at: int
) -> tuple:
    """(token budget, prompts, each prompt's unconstrained greedy continuation, the EOS id (a
    token of the first continuation), sampling params) of drawn `request_strategy` requests."""
    low = min_token_budget(jmamba.presets.tiny(family).chunk_size, max_num_seqs)
    budget = min(low + extra_budget, base_config(family).max_num_batched_tokens)
    prompts = [
        tuple(np.random.default_rng(r["seed"]).integers(0, 256, r["prompt_len"]).tolist())
        for r in requests
    ]
    free = [
        unconstrained(family, p, r["max_tokens"]) for p, r in zip(prompts, requests, strict=True)
    ]
    eos = (free[0][min(eos_at, len(free[0]) - 1)],)
    params = [
        SamplingParams(
            max_tokens=r["max_tokens"],
            min_tokens=min(r["min_tokens"], r["max_tokens"]),
            ignore_eos=r["ignore_eos"],
            stop_token_ids=() if r["stop_at"] is None else (f[min(r["stop_at"], len(f) - 1)],),
        )
        for r, f in zip(requests, free, strict=True)
    ]
    return budget, prompts, free, eos, params


@pytest.mark.parametrize("family", quick_first(FAMILIES))
@settings(max_examples=max(settings.default.max_examples // 2, 3))  # per family: CI time
@given(
    requests=st.lists(request_strategy, min_size=1, max_size=6),
    extra_budget=st.integers(0, 16),
    max_num_seqs=st.integers(1, 4),
    eos_at=st.integers(0, 7),
    async_scheduling=st.booleans(),
    decode_steps=st.sampled_from(DECODE_STEPS),
)
def test_random_schedule_is_valid_batch_invariant_and_stops(
    family, requests, extra_budget, max_num_seqs, eos_at, async_scheduling, decode_steps
):
    """Arrivals, aborts, small pools (preemption), varied budgets, EOS and stop tokens,
    min_tokens, with and without asynchronous scheduling, one or several decode steps a program:
    every request == the request served alone (synchronously, a step a program), which obeys the
    stopping rules."""
    budget, prompts, free, eos, params = drawn_workload(
        family, requests, extra_budget, max_num_seqs, eos_at
    )
    engine = make_engine(
        family,
        eos_token_ids=eos,
        max_num_batched_tokens=budget,
        max_num_seqs=max_num_seqs,
        async_scheduling=async_scheduling,
        decode_steps=decode_steps,
    )
    outputs, aborted, step = {}, set(), 0
    while step <= 6 or engine.has_unfinished:
        for i, r in enumerate(requests):
            if r["arrival"] == step:
                engine.add_request(list(prompts[i]), params[i], request_id=i)  # an int id
            if r["abort_at"] == step and engine.abort(i) is not None:
                aborted.add(str(i))
        outputs |= {o.request_id: o for o in engine.step()}  # validate_inputs is on
        step += 1
        assert step < 400
    assert (
        engine.inspect.scheduler.block_pool.num_used == 0
        and engine.inspect.scheduler.slot_pool.num_used == 0
    )
    event("preempted" if engine.inspect.scheduler.num_preemptions else "no preemption")
    event(f"async_scheduling={async_scheduling}")
    event(f"decode_steps={decode_steps}")
    for i, r in enumerate(requests):
        if str(i) in aborted:
            continue
        alone = served_alone(family, prompts[i], params[i], eos)
        assert outputs[str(i)].token_ids == alone.token_ids, i
        assert outputs[str(i)].finish_reason == alone.finish_reason, i
        stop_ids = set(params[i].stop_token_ids) | (set() if r["ignore_eos"] else set(eos))
        check_stopping(alone, free[i], params[i], stop_ids)
