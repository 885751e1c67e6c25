"""`Engine.warmup(prefill=True, sampled=True)` on the "serving" bucket table makes every program
ready that a step can run: random arrivals, prompt lengths, batch sizes and greedy or
temperature sampling (one program with `one_sampler_program`, as `jmamba serve` runs) compile
nothing more, and the warm-up's progress counted each program once."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

import jmamba
from runtime.core.engine_args import EngineArgs
from runtime.core.sampling_params import SamplingParams
from runtime.device.memory import resolve_config
from runtime.device.model_runner import ModelRunner
from runtime.engine import Engine
from tests.compiled import per_module
from tests.runtime.conftest import model_and_runner

FAMILY = "mamba2"
MAX_MODEL_LEN = 96
ARGS = EngineArgs(
    max_num_seqs=4,
    max_num_batched_tokens=64,
    max_model_len=MAX_MODEL_LEN,
    block_size=16,
    bucket_table="serving",
    one_sampler_program=True,
    async_scheduling=True,
    decode_steps=4,
    validate_inputs=True,
)


@per_module
def warmed_engine() -> Engine:
    model, _ = model_and_runner(FAMILY)
    engine = Engine(model, ARGS, runner=ModelRunner(model, resolve_config(model, ARGS)))
    engine.warmup(prefill=True, sampled=True)
    return engine


def test_the_warm_up_makes_every_possible_program_ready_and_says_so():
    engine = warmed_engine()
    possible = engine.buckets.num_programs(True, sampled=True)
    # (4 decode rows) + (none or 4 decode rows) x (16 or 64 tokens) x (1 or 4 prefill rows),
    # and the decode bucket as a program of 4 steps; greedy and sampled are one program.
    assert engine.buckets.prefill_tokens == (16, 64)
    assert possible == 1 + 2 * 2 * 2 + 1
    assert engine.runner.num_variants == possible
    progress = engine.runner.warmup_progress.snapshot()
    assert progress["programs_ready"] == progress["programs_total"] == possible
    assert progress["compiled"] + progress["loaded"] == possible


request = st.fixed_dictionaries(
    {
        "arrival": st.integers(0, 3),
        "prompt_len": st.integers(1, 12) | st.integers(13, 80),
        "max_tokens": st.integers(1, 6),
        "temperature": st.sampled_from([0.0, 0.8]),
    }
)


@settings(max_examples=8)
@given(requests=st.lists(request, min_size=1, max_size=7))
def test_random_requests_after_the_warm_up_compile_nothing(requests):
    engine = warmed_engine()
    programs = set(engine.runner.variants)
    vocab = jmamba.presets.tiny(FAMILY).vocab_size
    step = 0
    while step <= 3 or engine.has_unfinished:
        for i, r in enumerate(requests):
            if r["arrival"] == step:
                prompt = [(7 * i + 3 * t) % (vocab - 1) + 1 for t in range(r["prompt_len"])]
                params = SamplingParams(
                    max_tokens=min(r["max_tokens"], MAX_MODEL_LEN - len(prompt)),
                    temperature=r["temperature"],
                    seed=i,
                )
                engine.add_request(prompt, params, request_id=f"{step}-{i}")
        engine.step()
        step += 1
    assert set(engine.runner.variants) == programs
