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
) -> Engine:
    """A warmed-up engine holding `batch` requests of PROMPT_LEN random tokens (not yet stepped),
    prefilled `budget` tokens a step (default: all prompts in one step); `runner`: another such
    engine's runner (its compiled steps); else one on `tensor_parallel_size` devices whose
    parameters come from `params` (`RandomShards` for a model given as shapes); `speculative`:
    the engine's speculative decoding (None: off)."""
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
    )
    engine = Engine(model, config, params=params, runner=runner)
    engine.warmup()
    rng = np.random.default_rng(0)
    for _ in range(batch):
        prompt = rng.integers(0, model.config.vocab_size, PROMPT_LEN).tolist()
        engine.add_request(prompt, SamplingParams(max_tokens=4 * steps + 64))
    return engine


def time_steps(engine: Engine, steps: int) -> tuple[float, float, float]:
    """(wall, host, device) seconds per `Engine.step()` over `steps` decode steps, after the
    prefill step and three warm decode steps."""
    for _ in range(4):
        engine.step()
    host0, device0 = engine.stats.host_seconds, engine.stats.device_seconds
    start = time.perf_counter()
    for _ in range(steps):
        engine.step()
    step_s = (time.perf_counter() - start) / steps
    return (
        step_s,
        (engine.stats.host_seconds - host0) / steps,
        (engine.stats.device_seconds - device0) / steps,
    )
