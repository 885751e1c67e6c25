"""Multi-step decode (`EngineArgs.decode_steps`): while every scheduled request decodes, one
device program runs N decode steps, each feeding its sampled tokens to the next on the device.

The tokens are those of full recompute (greedy) and of the engine that runs a step a program
(sampled, logprobs, stop strings, streaming) whatever falls inside a program: a stop token, a
request's max_tokens or the engine's max_model_len, a preemption, an abort. The hypothesis
schedules of test_random_schedules.py, test_prefix_caching.py, test_data_parallel.py,
test_tensor_parallel_schedules.py and test_speculative_schedules.py draw N too.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from jmamba.text.tokenizer import byte_tokenizer
from runtime.core.buckets import Bucket
from runtime.core.sampling_params import SamplingParams
from runtime.engine import Engine
from tests.runtime.conftest import (
    FAMILIES,
    MAX_MODEL_LEN,
    base_config,
    make_engine,
    model_and_runner,
    naive_greedy,
)
from tests.runtime.engine.test_async_scheduling import assert_served_alike, serve
from tests.tiers import quick_first

N = 4


def prompt(seed: int, length: int) -> list[int]:
    return np.random.default_rng(seed).integers(0, 256, length).tolist()


def served(engine: Engine, requests: list[tuple[list[int], SamplingParams]], abort=None):
    """Serve `requests` (ids '0', '1', ...), aborting request `abort` after the second step;
    {id: output}, and the steps it took."""
    for i, (tokens, params) in enumerate(requests):
        engine.add_request(tokens, params, request_id=i)
    outputs, calls = {}, 0
    while engine.has_unfinished:
        outputs |= {o.request_id: o for o in engine.step()}  # validate_inputs is on
        calls += 1
        if calls == 2 and abort is not None:
            engine.abort(abort)
        assert calls < 300
    return outputs, calls


@pytest.mark.parametrize("async_scheduling", [False, True])
@pytest.mark.parametrize("family", quick_first(FAMILIES))
def test_greedy_tokens_equal_full_recompute_whatever_ends_inside_a_program(
    family, async_scheduling
):
    """Six requests in 12 KV blocks (two of 4 and 5 blocks growing to 7 each: preemption, where
    the model has attention) with an EOS met inside a program, max_tokens
    that end mid-program, a prompt that reaches max_model_len, and an abort: each completed
    request's tokens and finish reason are full recompute's; every pool is empty at the end; and
    programs of N steps ran."""
    eos_source = naive_greedy(family, prompt(1, 7), 12, stop_ids=())
    eos = (eos_source[5],)  # request 0 stops on it at its 6th token, inside a program
    requests = [
        (prompt(1, 7), SamplingParams(max_tokens=12)),
        (prompt(2, 32), SamplingParams(max_tokens=22, ignore_eos=True)),
        (prompt(3, 33), SamplingParams(max_tokens=21, ignore_eos=True)),
        (prompt(4, MAX_MODEL_LEN - 6), SamplingParams(max_tokens=20, ignore_eos=True)),
        (prompt(5, 5), SamplingParams(max_tokens=6, ignore_eos=True)),
        (prompt(6, 9), SamplingParams(max_tokens=10, ignore_eos=True)),
    ]
    engine = make_engine(
        family, eos_token_ids=eos, decode_steps=N, async_scheduling=async_scheduling
    )
    outputs, calls = served(engine, requests, abort="5")
    for i, (tokens, params) in enumerate(requests[:5]):
        stop_ids = () if params.ignore_eos else eos
        room = min(params.max_tokens, MAX_MODEL_LEN - len(tokens))
        expected = naive_greedy(family, tokens, room, stop_ids=stop_ids)
        assert outputs[str(i)].token_ids == expected, i
        reason = "stop" if expected[-1:] == list(stop_ids) else "length"
        assert outputs[str(i)].finish_reason == reason, i
    assert outputs["0"].finish_reason == "stop" and outputs["3"].finish_reason == "length"
    scheduler = engine.inspect.scheduler
    assert scheduler.block_pool.num_used == 0 and scheduler.slot_pool.num_used == 0
    assert scheduler.num_preemptions > 0 or not engine.model_config.has_attention
    assert any(key.steps == N for key in engine.runner.variants)
    assert engine.stats.num_steps > calls  # some calls ran several steps


def test_sampled_outputs_logprobs_stop_strings_and_streams_equal_a_step_a_program():
    """Seeded temperature, top-k / top-p, min_tokens masks, logprobs and a stop string, streamed,
    prompts long enough to preempt: the outputs, streamed tokens and text of N steps a program
    (synchronous and asynchronous) equal a step a program's; log-probabilities to float rounding
    (the program of N steps is another XLA program). One family, as test_async_scheduling.py."""
    family = "mamba2"
    model, runner = model_and_runner(family)
    prompts = [prompt(10 + i, n) for i, n in enumerate((5, 30, 12, 40, 3, 17, 26))]
    served_by = {}
    for decode_steps, async_scheduling in ((1, False), (N, False), (N, True)):
        config = dataclasses.replace(
            base_config(family), decode_steps=decode_steps, async_scheduling=async_scheduling
        )
        engine = Engine(model, config, runner=runner, tokenizer=byte_tokenizer())
        served_by[decode_steps, async_scheduling] = serve(engine, prompts)
    expected = served_by.pop((1, False))
    for outputs in served_by.values():
        assert_served_alike(outputs, expected, len(prompts))


def test_a_program_runs_decode_steps_alone():
    """A step with a prefill row runs alone (N = 1); once every request decodes, programs of N
    steps follow; a request arriving makes the next program one step again."""
    engine = make_engine("mamba2", decode_steps=N)
    engine.add_request(prompt(20, 5), SamplingParams(max_tokens=30, ignore_eos=True))
    engine.step()
    assert len(engine.records) == 1 and not engine.records[-1].bucket.is_decode_only
    engine.step()
    assert [r.bucket for r in engine.records][1:] == [Bucket(4, 1, 0, 0)] * N
    engine.add_request(prompt(21, 5), SamplingParams(max_tokens=3))
    before = len(engine.records)
    engine.step()
    assert len(engine.records) == before + 1 and not engine.records[-1].bucket.is_decode_only


def test_decode_steps_is_checked():
    with pytest.raises(ValueError, match="decode_steps=0 must be an int"):
        dataclasses.replace(base_config("mamba2"), decode_steps=0)
    with pytest.raises(ValueError, match="decode_steps=65"):
        dataclasses.replace(base_config("mamba2"), decode_steps=65)
