"""`dequantize` of whole weights and of slices at any offset (the per-shard reader's reads),
against the writer's numpy dequantization, for blocks that divide the weight and ones that do
not, per channel and per tensor, with a leading experts axis."""

from __future__ import annotations

import numpy as np
import pytest

from jmamba.checkpoints.quantization.dequantization import (
    check_scale_shape,
    dequantize,
    scale_grid,
    whole,
)
from tests.jmamba.quantization.fp8_writer import block_fp8, compressed_tensors, quantize


@pytest.mark.parametrize(
    "fmt",
    [
        block_fp8(16, 24),
        block_fp8(8, 8),
        compressed_tensors("channel"),
        compressed_tensors("tensor"),
    ],
    ids=["16x24", "8x8", "channel", "tensor"],
)
def test_whole_and_sliced_reads(fmt):
    rng = np.random.default_rng(0)
    weight = rng.normal(size=(3, 40, 56)).astype(np.float32)
    entries, scale, expected = quantize(weight, fmt)
    check_scale_shape(scale.shape, "w_scale", weight.shape, fmt.block)
    grid = scale_grid(scale, weight.shape, fmt.block)
    assert np.array_equal(dequantize(entries, grid, fmt.block, whole(weight.shape)), expected)
    for _ in range(20):
        rows = sorted(rng.choice(41, 2, replace=False))
        cols = sorted(rng.choice(57, 2, replace=False))
        index = (slice(1, 3), slice(*rows), slice(*cols))
        got = dequantize(entries[index], grid, fmt.block, index)
        assert np.array_equal(got, expected[index])
