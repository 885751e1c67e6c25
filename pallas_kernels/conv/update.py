"""Causal depthwise conv1d over 1 + K decode lanes: the kernel of `causal_conv1d_update_reference`
(`conv/reference.py`, with the glossary). Grid (D / block_d, B): a row's channel blocks first
(`pallas_kernels/_common.py`, "Decode launch order").
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plgpu

from pallas_kernels._common import live_slot, loads_before_stores, pow2, sds_like
from pallas_kernels.conv.reference import check_update_args
from pallas_kernels.conv.window import load_taps, load_window, store_window, tap_sum


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
    d0, b = pl.program_id(0) * block_d, pl.program_id(1)
    d_sl = pl.ds(d0, block_d)
    d_mask = d0 + jnp.arange(block_d) < channels
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
    """Pallas kernel for `causal_conv1d_update_reference`; grid (D / block_d, B), state aliased."""
    width = check_update_args(x, weight, bias, conv_state, read_slots, write_slots, activation)
    batch, lanes, channels = x.shape
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
        grid=(pl.cdiv(channels, block_d), batch),
        input_output_aliases={5: 1},
        compiler_params=plgpu.CompilerParams(num_warps=num_warps, num_stages=1),
        interpret=interpret,
        name="causal_conv1d_update",
    )(read_slots.astype(jnp.int32), write_slots.astype(jnp.int32), x, weight, bias, conv_state)
