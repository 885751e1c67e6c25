"""Causal depthwise conv1d over ragged `Rows` (prefill): the launches of the kernels in
`conv/prefill_kernels.py`, for `causal_conv1d_prefill_reference` (`conv/reference.py`, with the
glossary).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plgpu

from pallas_kernels._common import pow2, sds_like
from pallas_kernels.conv.prefill_kernels import final_window_kernel, walk_kernel
from pallas_kernels.conv.reference import check_prefill_args
from pallas_kernels.rows import Rows

MAX_UNROLL = 16


def check_walk(walk_tokens: int, unroll: int) -> None:
    """Raise ValueError unless `unroll` is a power of two in [1, MAX_UNROLL] and `walk_tokens` is
    a power of two >= unroll (a segment is a whole number of loop steps)."""
    if not (1 <= unroll <= MAX_UNROLL and pow2(unroll) == unroll):
        raise ValueError(f"unroll={unroll} must be a power of two in [1, {MAX_UNROLL}]")
    if not (walk_tokens >= unroll and pow2(walk_tokens) == walk_tokens):
        raise ValueError(f"walk_tokens={walk_tokens} must be a power of two >= unroll={unroll}")


@functools.partial(
    jax.jit,
    static_argnames=("activation", "interpret", "block_d", "num_warps", "walk_tokens", "unroll"),
)
def causal_conv1d_prefill(
    x: jax.Array,
    weight: jax.Array,
    bias: jax.Array | None,
    conv_state: jax.Array,
    rows: Rows,
    *,
    activation: str | None = "silu",
    interpret: bool = False,
    block_d: int = 1024,
    num_warps: int = 4,
    walk_tokens: int = 128,
    unroll: int = 4,
) -> tuple[jax.Array, jax.Array]:
    """Pallas kernel for `causal_conv1d_prefill_reference` (same arguments and results).

    Two launches: the walk kernel over (token segments, channel blocks), each program walking
    `walk_tokens` consecutive tokens of one channel block, `unroll` per loop step; then the final
    windows over (rows, channel blocks), written into `conv_state` in place (aliased). Both read
    the rows from `query_start_loc` themselves. (A tiled kernel, block_t x block_d tiles with one
    shifted load per tap, was removed: at its best it was slower than the walk kernel at
    1 x 8192 tokens, D 8192 on the H100, benchmarks/results/README.md, issue 14.)
    """
    width, num_rows = check_prefill_args(x, weight, bias, conv_state, rows, activation)
    check_walk(walk_tokens, unroll)
    num_tokens, channels = x.shape
    qsl, _, has_init, read, write, _ = rows.int32_operands()
    bias = jnp.zeros((channels,), jnp.float32) if bias is None else bias
    # Blocks may shrink with T: a token's taps are summed in the same order in any block, so this
    # does not make a row's result depend on the padded shape.
    block_d = min(pow2(block_d), pow2(channels))
    walk_tokens = min(walk_tokens, max(unroll, pow2(num_tokens)))  # at most T, whole loop steps
    params = plgpu.CompilerParams(num_warps=num_warps, num_stages=1)
    dims = dict(channels=channels, width=width, block_d=block_d)
    y = pl.pallas_call(
        functools.partial(
            walk_kernel,
            **dims,
            num_tokens=num_tokens,
            num_rows=num_rows,
            walk_tokens=walk_tokens,
            unroll=unroll,
            activation=activation,
        ),
        out_shape=sds_like(x),
        grid=(pl.cdiv(num_tokens, walk_tokens), pl.cdiv(channels, block_d)),
        compiler_params=params,
        interpret=interpret,
        name="causal_conv1d_prefill",
    )(qsl, has_init, read, x, weight, bias, conv_state)
    if width == 1:
        return y, conv_state
    return y, pl.pallas_call(
        functools.partial(final_window_kernel, **dims),
        out_shape=sds_like(conv_state),
        grid=(num_rows, pl.cdiv(channels, block_d)),
        input_output_aliases={5: 0},
        compiler_params=params,
        interpret=interpret,
        name="causal_conv1d_final_window",
    )(qsl, has_init, read, write, x, conv_state)
