"""Grid points of the causal conv1d kernels: the prefill walk and the decode update."""

from __future__ import annotations

import functools

import jax.numpy as jnp

from benchmarks.checks.kernels.case import TOLERANCE, Case, Shape
from benchmarks.checks.kernels.layouts import (
    lane_live,
    lanes,
    normal,
    random_pool,
    row_lengths,
    varlen,
)
from pallas_kernels.conv import prefill as conv
from pallas_kernels.conv import reference as conv_ref
from pallas_kernels.conv import update as conv_update_kernel


def conv_prefill(channels: int, width: int, dtype, walk_tokens: int = 16) -> Shape:
    """The walk kernel in segments of `walk_tokens`: rows meet segment edges at odd offsets."""
    block = walk_tokens

    def build(rng) -> Case:
        rows = varlen(rng, row_lengths(block), block)
        args = (
            normal(rng, (rows.num_tokens, channels), dtype),
            normal(rng, (channels, width), dtype, width**-0.5),
            normal(rng, (channels,), dtype, 0.1),
            random_pool(rng, rows.num_slots, (channels, width - 1), dtype),
            rows.as_rows(None),
        )
        return Case(
            functools.partial(conv.causal_conv1d_prefill, walk_tokens=walk_tokens),
            conv_ref.causal_conv1d_prefill_reference,
            args,
            3,
            rows.live[:, None],
            rows.write,
            TOLERANCE[dtype, "conv"],
            rows.describe(),
        )

    return Shape(
        f"conv_prefill walk {walk_tokens} D={channels} W={width} {jnp.dtype(dtype).name}", build
    )


def conv_update(channels: int, width: int, num_lanes: int, dtype, batch: int = 6) -> Shape:
    def build(rng) -> Case:
        read, write, num_slots = lanes(rng, batch, num_lanes)
        args = (
            normal(rng, (batch, num_lanes, channels), dtype),
            normal(rng, (channels, width), dtype, width**-0.5),
            normal(rng, (channels,), dtype, 0.1),
            random_pool(rng, num_slots, (channels, width - 1), dtype),
            read,
            write,
        )
        return Case(
            conv_update_kernel.causal_conv1d_update,
            conv_ref.causal_conv1d_update_reference,
            args,
            3,
            lane_live(write, 1),
            write.ravel(),
            TOLERANCE[dtype, "conv"],
            f"B={batch} L={num_lanes}",
        )

    return Shape(f"conv_update D={channels} W={width} L={num_lanes} {jnp.dtype(dtype).name}", build)
