"""`EngineArgs.one_sampler_program`: greedy steps run the sampled sampler program, so greedy and
temperature-sampled requests share their compiled steps, with the greedy tokens of the naive loop
and the sampled tokens of an engine without it."""

from __future__ import annotations

import dataclasses

import pytest

from runtime.core.engine_args import EngineArgs
from runtime.core.sampling_params import SamplingParams
from runtime.device.memory import resolve_config
from runtime.device.model_runner import ModelRunner
from runtime.engine import Engine
from tests.runtime.conftest import base_config, model_and_runner, naive_greedy, run_to_completion

FAMILY = "qwen3_next"
PROMPTS = [[4, 9, 2, 7, 7, 1], [3, 3, 8]]
SAMPLED = SamplingParams(max_tokens=5, temperature=0.8, seed=11)


def serve(one_sampler_program: bool) -> tuple[Engine, dict[str, list[int]]]:
    """A fresh runner warmed as a server warms it (greedy and sampled), then a greedy and a
    sampled request together and a greedy one alone."""
    model, _ = model_and_runner(FAMILY)
    config = dataclasses.replace(base_config(FAMILY), one_sampler_program=one_sampler_program)
    engine = Engine(model, config, runner=ModelRunner(model, resolve_config(model, config)))
    engine.warmup(prefill="alone", sampled=True)
    engine.add_request(PROMPTS[0], SamplingParams(max_tokens=5), request_id="greedy")
    engine.add_request(PROMPTS[1], SAMPLED, request_id="sampled")
    outputs = run_to_completion(engine)
    engine.add_request(PROMPTS[1], SamplingParams(max_tokens=5), request_id="alone")
    return engine, outputs | run_to_completion(engine)


def test_greedy_and_sampled_requests_share_one_program_and_keep_their_tokens():
    merged, merged_out = serve(True)
    plain, plain_out = serve(False)
    assert merged_out == plain_out
    assert merged_out["greedy"] == naive_greedy(FAMILY, PROMPTS[0], 5)
    assert merged_out["alone"] == naive_greedy(FAMILY, PROMPTS[1], 5)
    assert all(v.mode.sampled for v in merged.runner.variants)
    # Warmed greedy and sampled, then run: one program a bucket, where the plain engine has two.
    assert merged.runner.num_variants == len({v.bucket for v in merged.runner.variants})
    assert plain.runner.num_variants > merged.runner.num_variants


def test_bad_value_is_refused():
    with pytest.raises(ValueError, match="one_sampler_program"):
        EngineArgs(one_sampler_program="yes")  # type: ignore[arg-type]
