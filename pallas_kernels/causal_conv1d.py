"""Causal depthwise conv1d over ragged sequences (prefill) and over 1 + K decode lanes (update).

Glossary: T flat tokens, R rows, B decode rows, L lanes per decode row, S state slots, D channels,
W conv width. The conv state of a slot is the window of the last W - 1 inputs, oldest first.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plgpu

from pallas_kernels._common import (
    check_shape,
    live_slot,
    loads_before_stores,
    pow2,
    sds_like,
)
from pallas_kernels._conv_prefill import final_window_kernel, walk_kernel
from pallas_kernels._conv_window import load_taps, load_window, store_window, tap_sum
from pallas_kernels.causal_conv1d_reference import (
    check_activation,
    check_common,
)

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
    query_start_loc: jax.Array,
    has_initial_state: jax.Array,
    read_slots: jax.Array,
    write_slots: jax.Array,
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
    shifted load per tap, was removed: its best was 237 us per call against the walk kernel's
    148 us at 1 x 8192 tokens, D 8192 on the H100, RESULTS.md, issue 14.)
    """
    check_activation(activation)
    check_walk(walk_tokens, unroll)
    num_tokens, channels = x.shape
    width = check_common(channels, weight, bias, conv_state)
    num_rows = query_start_loc.shape[0] - 1
    rows = (
        query_start_loc.astype(jnp.int32),
        has_initial_state.astype(jnp.int32),
        read_slots.astype(jnp.int32),
    )
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
    )(*rows, x, weight, bias, conv_state)
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
    )(*rows, write_slots.astype(jnp.int32), x, conv_state)


def _update_kernel(
    read_ref,
    write_ref,
    x_ref,
    w_ref,
    bias_ref,
    state_in_ref,
    y_ref,
    state_ref,
    *,
    lanes,
    channels,
    width,
    block_d,
    activation,
    on_gpu,
):
    """One (row, channel block): the window is W - 1 register vectors shifted lane by lane."""
    del state_in_ref  # aliased to state_ref
    b = pl.program_id(0)
    d_sl = pl.ds(pl.program_id(1) * block_d, block_d)
    d_mask = pl.program_id(1) * block_d + jnp.arange(block_d) < channels
    num_slots = state_ref.shape[0]
    seq = load_window(state_ref, read_ref[b], d_sl, d_mask, width)
    loads_before_stores(on_gpu)  # lane 0 may write the slot it read (in place)
    taps, bias = load_taps(w_ref, bias_ref, d_sl, d_mask, width)
    for t in range(lanes):
        tt = jnp.int32(t)
        seq.append(plgpu.load(x_ref.at[b, tt, d_sl], mask=d_mask, other=0.0).astype(jnp.float32))
        y = tap_sum(taps, bias, seq[t : t + width], activation)
        write = write_ref[b, tt]
        writes = live_slot(write, num_slots)
        plgpu.store(
            y_ref.at[b, tt, d_sl], jnp.where(writes, y, 0.0).astype(y_ref.dtype), mask=d_mask
        )
        store_window(state_ref, write, seq[t + 1 : t + width], d_sl, d_mask)


@functools.partial(jax.jit, static_argnames=("activation", "interpret", "block_d", "num_warps"))
def causal_conv1d_update(
    x: jax.Array,
    weight: jax.Array,
    bias: jax.Array | None,
    conv_state: jax.Array,
    read_slots: jax.Array,
    write_slots: jax.Array,
    *,
    activation: str | None = "silu",
    interpret: bool = False,
    block_d: int = 256,
    num_warps: int = 4,
) -> tuple[jax.Array, jax.Array]:
    """Pallas kernel for `causal_conv1d_update_reference`; grid (B, D / block_d), state aliased."""
    check_activation(activation)
    batch, lanes, channels = x.shape
    width = check_common(channels, weight, bias, conv_state)
    check_shape("read_slots", read_slots, (batch,))
    check_shape("write_slots", write_slots, (batch, lanes))
    bias = jnp.zeros((channels,), jnp.float32) if bias is None else bias
    block_d = min(pow2(block_d), pow2(channels))
    return pl.pallas_call(
        functools.partial(
            _update_kernel,
            lanes=lanes,
            channels=channels,
            width=width,
            block_d=block_d,
            activation=activation,
            on_gpu=not interpret,
        ),
        out_shape=(sds_like(x), sds_like(conv_state)),
        grid=(batch, pl.cdiv(channels, block_d)),
        input_output_aliases={5: 1},
        compiler_params=plgpu.CompilerParams(num_warps=num_warps, num_stages=1),
        interpret=interpret,
        name="causal_conv1d_update",
    )(read_slots.astype(jnp.int32), write_slots.astype(jnp.int32), x, weight, bias, conv_state)
