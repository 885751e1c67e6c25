"""Every buffer a step's CUDA graph reads or writes keeps its address from call to call
(runtime.device.step_buffers), and a dispatched step's outputs survive the next step's dispatch."""

from __future__ import annotations

import numpy as np

from runtime.core.buckets import BucketPolicy
from runtime.core.builder import build_dummy
from runtime.device.step_buffers import buffer_addresses
from tests.runtime.conftest import model_and_runner


def test_a_variant_s_buffers_keep_their_addresses_and_outputs_outlive_the_next_step():
    """A decode bucket, synchronous then carrying: the input slot, the outputs, the carried
    tokens and the caches stay where they were; the first step is fetched after the second."""
    _, runner = model_and_runner("mamba2")
    config = runner.config
    bucket = BucketPolicy(config).decode_buckets()[0]
    dummy = build_dummy(
        bucket, max_blocks=config.max_blocks_per_seq, state_block_size=config.boundary_block_size
    )
    for carry in (False, True):
        first = runner.dispatch(bucket, [dummy], carry=carry)
        key = runner.variants[-1]
        before = runner.buffers.addresses(key), buffer_addresses(runner.caches)
        second = runner.dispatch(bucket, [dummy], carry=carry)
        assert (runner.buffers.addresses(key), buffer_addresses(runner.caches)) == before
        # The first step's copies are still there, and equal to the second's (same inputs).
        np.testing.assert_array_equal(runner.fetch(first)[0], runner.fetch(second)[0])
