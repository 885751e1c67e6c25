"""A warmed-up engine holding B requests of PROMPT_LEN random tokens, and the wall / host / device
time of its decode steps."""

from __future__ import annotations

import time

import numpy as np

from jmamba import HybridLM
from runtime.core.engine_args import EngineArgs
from runtime.core.sampling_params import SamplingParams
from runtime.core.speculative_config import SpeculativeConfig
from runtime.device.model_runner import ModelRunner
from runtime.device.placement import ParamSource, place_params
from runtime.engine import Engine

PROMPT_LEN = 16


def bench_config(
    max_num_seqs: int, budget: int, max_model_len: int, decode_rows: tuple[int, ...], **options
) -> EngineArgs:
    """The benches' engine config: KV blocks of 16 tokens, decode row buckets `decode_rows`, one
    prefill bucket (`budget` tokens, `max_num_seqs` rows); `options`: any other field."""
    return EngineArgs(
        max_num_seqs=max_num_seqs,
        max_num_batched_tokens=budget,
        max_model_len=max_model_len,
        block_size=16,
        decode_row_buckets=decode_rows,
        prefill_token_buckets=(budget,),
        prefill_row_buckets=(max_num_seqs,),
        **options,
    )


def make_engine(
    model: HybridLM,
    batch: int,
    steps: int,
    max_model_len: int = 256,
    budget: int | None = None,
    async_scheduling: bool = False,
    runner: ModelRunner | None = None,
    tensor_parallel_size: int = 1,
    params: ParamSource = place_params,
    speculative: SpeculativeConfig | None = None,
    decode_steps: int = 1,
) -> Engine:
    """A warmed-up engine holding `batch` requests of PROMPT_LEN random tokens (not yet stepped),
    prefilled `budget` tokens a step (default: all prompts in one step); `runner`: another such
    engine's runner (its compiled steps); else one on `tensor_parallel_size` devices whose
    parameters come from `params` (`RandomShards` for a model given as shapes); `speculative`:
    the engine's speculative decoding (None: off); `decode_steps`: decode steps a program."""
    least = model.config.chunk_size + batch - 1
    budget = max(budget or batch * PROMPT_LEN, least)
    config = bench_config(
        batch,
        budget,
        max_model_len,
        (max(batch, 2),),  # the default's smallest is 2
        async_scheduling=async_scheduling,
        tensor_parallel_size=tensor_parallel_size,
        speculative=speculative,
        decode_steps=decode_steps,
    )
    engine = Engine(model, config, params=params, runner=runner)
    engine.warmup()
    rng = np.random.default_rng(0)
    for _ in range(batch):
        prompt = rng.integers(0, model.config.vocab_size, PROMPT_LEN).tolist()
        engine.add_request(prompt, SamplingParams(max_tokens=4 * steps + 64))
    return engine


def time_steps(engine: Engine, steps: int) -> tuple[float, float, float]:
    """(wall, host, device) seconds per decode step over at least `steps` decode steps, after the
    prefill step and three warm calls of `Engine.step()` (each runs several decode steps when
    the engine's `decode_steps` asks for them)."""
    for _ in range(4):
        engine.step()
    host0, device0 = engine.stats.host_seconds, engine.stats.device_seconds
    steps0 = engine.stats.num_steps
    start = time.perf_counter()
    while engine.stats.num_steps - steps0 < steps:
        engine.step()
    elapsed, done = time.perf_counter() - start, engine.stats.num_steps - steps0
    return (
        elapsed / done,
        (engine.stats.host_seconds - host0) / done,
        (engine.stats.device_seconds - device0) / done,
    )
