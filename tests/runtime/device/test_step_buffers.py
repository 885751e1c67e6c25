"""Every buffer a step's CUDA graph reads or writes keeps its address from call to call
(runtime.device.step_buffers), a dispatched step's outputs survive the next step's dispatch, and
making a variant's output buffers costs no second trace of the step."""

from __future__ import annotations

import numpy as np
from jax import monitoring

from runtime.core.buckets import BucketPolicy
from runtime.core.builder import build_dummy
from runtime.device.model_runner import ModelRunner
from runtime.device.step_buffers import buffer_addresses
from tests.runtime.conftest import model_and_runner


def test_a_variant_s_buffers_keep_their_addresses_and_outputs_outlive_the_next_step():
    """A decode bucket: the input slot, the outputs, the carried tokens and the caches stay
    where they were; the first step is fetched after the second."""
    _, runner = model_and_runner("mamba2")
    config = runner.config
    bucket = BucketPolicy(config).decode_buckets()[0]
    dummy = build_dummy(
        bucket, max_blocks=config.max_blocks_per_seq, state_block_size=config.boundary_block_size
    )
    first = runner.dispatch(bucket, [dummy])
    key = runner.variants[-1]
    before = runner.buffers.addresses(key), buffer_addresses(runner.caches)
    second = runner.dispatch(bucket, [dummy])
    assert (runner.buffers.addresses(key), buffer_addresses(runner.caches)) == before
    # The first step's copies are still there, and equal to the second's (same inputs).
    np.testing.assert_array_equal(runner.fetch(first).tokens[0], runner.fetch(second).tokens[0])


def test_a_variant_is_traced_once_though_its_output_buffers_come_from_the_trace():
    """`spmd_step.with_output_buffers` replays the traced step: compiling a variant traces
    `spmd_step` once (it was twice: once for the output shapes, again with the buffers). A
    runner of its own, without a step store: the shared one may load the variant instead."""
    model, shared = model_and_runner("mamba2")
    runner = ModelRunner(model, shared.config)
    config = runner.config
    bucket = BucketPolicy(config).lone_prefill_buckets()[0]  # not compiled by the test above
    dummy = build_dummy(
        bucket, max_blocks=config.max_blocks_per_seq, state_block_size=config.boundary_block_size
    )
    traces = []

    def count(event: str, seconds: float, **kwargs) -> None:
        if event.endswith("jaxpr_trace_duration") and kwargs.get("fun_name") == "spmd_step":
            traces.append(seconds)

    monitoring.register_event_duration_secs_listener(count)
    try:
        before = runner.num_variants
        runner.fetch(runner.dispatch(bucket, [dummy]))
    finally:
        monitoring.unregister_event_duration_listener(count)
    assert runner.num_variants == before + 1 and len(traces) == 1
