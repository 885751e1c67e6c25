"""Decode at long contexts: the compiled decode step called with its inputs moved to C tokens of
context (each row its own KV blocks; no prefill is run), device time only."""

from __future__ import annotations

import dataclasses
import time

import numpy as np

from benchmarks.harness.roofline import step_bytes
from benchmarks.harness.serving import PROMPT_LEN, make_engine
from jmamba import HybridLM
from runtime.core.step_batch import StepBatch
from runtime.device.placement import ParamSource, place_params


def at_context(batch_in: StepBatch, context: int, block_size: int) -> StepBatch:
    """A pure-decode batch (one lane per row) moved to `context` tokens of context: live row r
    decodes position `context` and owns blocks 1 + r * n ... (r + 1) * n, n = the blocks of
    context + 1 tokens (distinct per row, never NULL)."""
    inputs = batch_in.inputs
    decode = inputs.decode
    if decode.width != 1 or inputs.num_prefill_tokens:
        raise ValueError("at_context takes a pure-decode batch of one lane per row")
    live = np.asarray(decode.query_lens) > 0
    n = -(-(context + 1) // block_size)
    rows = np.arange(decode.num_rows)
    table = np.zeros_like(np.asarray(decode.block_table))
    table[:, :n] = np.where(live[:, None], 1 + rows[:, None] * n + np.arange(n)[None, :], 0)
    positions = np.where(live, context, 0).astype(np.int32)
    kv_slots = table[rows, context // block_size] * block_size + context % block_size
    new_decode = dataclasses.replace(
        decode, seq_lens=np.where(live, context + 1, 0).astype(np.int32), block_table=table
    )
    new_inputs = dataclasses.replace(
        inputs,
        decode=new_decode,
        positions=_with_head(inputs.positions, positions),
        kv_slots=_with_head(inputs.kv_slots, np.where(live, kv_slots, 0).astype(np.int32)),
    )
    return dataclasses.replace(batch_in, inputs=new_inputs)


def _with_head(array: np.ndarray, head: np.ndarray) -> np.ndarray:
    out = np.array(array)
    out[: len(head)] = head
    return out


def bench_context(
    model: HybridLM,
    batch: int,
    context: int,
    steps: int,
    bandwidth: float,
    budget: int = 256,
    params: ParamSource = place_params,
) -> dict:
    """Device ms of the compiled decode step at `context` tokens of context (pipelined calls);
    the runner's parameters from `params`."""
    # Prefill `budget` tokens a step: the ragged jnp prefill attention gathers each token's
    # max_model_len window (4096 tokens at 8k would need 34 GB; 256 at 32k on the Qwen3-Next
    # shape, head dim 256, asked for 24.6 GiB).
    engine = make_engine(
        model, batch, steps, context + 4 * PROMPT_LEN, budget=budget, params=params
    )
    engine.step()
    while engine.inspect.last_batch.inputs.num_prefill_tokens:  # until a pure-decode step has run
        engine.step()
    runner, bucket = engine.runner, engine.last_bucket
    moved = at_context(engine.inspect.last_batch, context, engine.config.block_size)
    packed = runner.device_inputs(bucket, [moved])
    for _ in range(3):
        step = runner.dispatch(bucket, [moved], packed)
    np.asarray(step.tokens)
    start = time.perf_counter()
    for _ in range(steps):
        step = runner.dispatch(bucket, [moved], packed)
    np.asarray(step.tokens)
    device_s = (time.perf_counter() - start) / steps
    moved_bytes = step_bytes(model, engine, batch, context)
    roofline_s = sum(moved_bytes.values()) / bandwidth
    return dict(
        batch=batch,
        context=context,
        device_ms=1e3 * device_s,
        roofline_ms=1e3 * roofline_s,
        x_roofline=device_s / roofline_s,
        bytes=moved_bytes,
    )
