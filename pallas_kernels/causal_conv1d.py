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
    safe_slot,
    sds_like,
    silu,
    token_rows,
)
from pallas_kernels.causal_conv1d_reference import (
    check_activation,
    check_common,
)

# ----------------------------------------------------------------------------- Pallas kernels


def _load_taps(w_ref, bias_ref, d_sl, d_mask, width):
    """Weight columns [BD] per tap (fp32) and the bias [BD]."""
    taps = [
        plgpu.load(w_ref.at[d_sl, jnp.int32(j)], mask=d_mask, other=0.0).astype(jnp.float32)
        for j in range(width)
    ]
    return taps, plgpu.load(bias_ref.at[d_sl], mask=d_mask, other=0.0).astype(jnp.float32)


def _prefill_kernel(
    start_ref,
    slot_ref,
    x_ref,
    w_ref,
    bias_ref,
    state_ref,
    y_ref,
    *,
    num_tokens,
    channels,
    width,
    block_t,
    block_d,
    activation,
    split_paths,
):
    """One (token block, channel block): every tap reads x or, near a row start, the slot window.

    With `split_paths`, blocks starting at token W - 1 or later read x as contiguous shifted tiles
    (pl.ds rows) and gather the slot windows only when a row's first W - 1 tokens fall in the
    block; earlier blocks (whose shifted tiles would start before token 0) keep the general gather
    path.
    """
    tb0 = pl.program_id(0) * block_t
    t = tb0 + jnp.arange(block_t)
    d = pl.program_id(1) * block_d + jnp.arange(block_d)
    t_mask, d_mask = t < num_tokens, d < channels
    d_sl = pl.ds(pl.program_id(1) * block_d, block_d)
    start = plgpu.load(start_ref.at[pl.ds(tb0, block_t)], mask=t_mask, other=num_tokens + 1)
    slot = plgpu.load(slot_ref.at[pl.ds(tb0, block_t)], mask=t_mask, other=0)
    local = t - start  # < 0 for padding tokens
    taps, bias = _load_taps(w_ref, bias_ref, d_sl, d_mask, width)
    td_mask = t_mask[:, None] & d_mask[None, :]

    def block(contiguous: bool, with_init: bool) -> None:
        acc = jnp.broadcast_to(bias[None, :], (block_t, block_d))
        for j in range(width):
            back = width - 1 - j  # tap j reads the token `back` steps earlier
            in_row = local >= back
            rows = pl.ds(tb0 - back, block_t) if contiguous else jnp.maximum(t - back, 0)[:, None]
            xv = plgpu.load(
                x_ref.at[rows, d_sl if contiguous else d[None, :]],
                mask=td_mask & in_row[:, None],
                other=0.0,
            )
            acc = acc + taps[j][None, :] * xv.astype(jnp.float32)
            if back and with_init:  # a row's first `back` tokens read its window at local + j
                from_init = (~in_row) & (local >= 0) & (slot > 0)
                col = jnp.clip(local + j, 0, width - 2)
                iv = plgpu.load(
                    state_ref.at[slot[:, None], d[None, :], col[:, None]],
                    mask=td_mask & from_init[:, None],
                    other=0.0,
                )
                acc = acc + taps[j][None, :] * iv.astype(jnp.float32)
        y = silu(acc) if activation == "silu" else acc
        y = jnp.where((local >= 0)[:, None], y, 0.0)
        plgpu.store(y_ref.at[pl.ds(tb0, block_t), d_sl], y.astype(y_ref.dtype), mask=td_mask)

    if not split_paths:
        block(False, True)
        return
    starts = (local >= 0) & (local < width - 1) & (slot > 0) & t_mask
    need_init = jnp.sum(starts.astype(jnp.int32)) > 0  # (no reduce_or in the Triton lowering)
    shifted = tb0 >= width - 1  # every shifted tile starts at or after token 0
    pl.when(~shifted)(lambda: block(False, True))
    pl.when(shifted & need_init)(lambda: block(True, True))
    pl.when(shifted & ~need_init)(lambda: block(True, False))


def _final_window_kernel(
    qsl_ref,
    has_init_ref,
    read_ref,
    write_ref,
    x_ref,
    state_in_ref,
    state_ref,
    *,
    channels,
    width,
    block_d,
):
    """One (row, channel block): the last W - 1 entries of (initial window ++ row tokens)."""
    del state_in_ref  # aliased to state_ref
    r = pl.program_id(0)
    d_sl = pl.ds(pl.program_id(1) * block_d, block_d)
    d_mask = pl.program_id(1) * block_d + jnp.arange(block_d) < channels
    start, length = qsl_ref[r], qsl_ref[r + 1] - qsl_ref[r]
    num_slots = state_ref.shape[0]
    read = jnp.where(has_init_ref[r] != 0, read_ref[r], 0)
    reads, write = live_slot(read, num_slots), write_ref[r]
    window = []
    for k in range(width - 1):  # load everything before storing: the slots may coincide
        i = length + k  # index into init ++ tokens
        from_x = plgpu.load(
            x_ref.at[jnp.maximum(start + i - (width - 1), 0), d_sl],
            mask=d_mask & (i >= width - 1),
            other=0.0,
        )
        col = jnp.clip(i, 0, width - 2)
        from_init = plgpu.load(
            state_ref.at[safe_slot(read, num_slots), d_sl, col],
            mask=d_mask & (i < width - 1) & reads,
            other=0.0,
        )
        window.append(from_x.astype(jnp.float32) + from_init.astype(jnp.float32))
    for k in range(width - 1):
        plgpu.store(
            state_ref.at[safe_slot(write, num_slots), d_sl, jnp.int32(k)],
            window[k].astype(state_ref.dtype),
            mask=d_mask & live_slot(write, num_slots),
        )


@functools.partial(
    jax.jit,
    static_argnames=("activation", "interpret", "block_t", "block_d", "num_warps", "split_paths"),
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
    block_t: int = 16,
    block_d: int = 512,
    num_warps: int = 4,
    split_paths: bool = True,
) -> tuple[jax.Array, jax.Array]:
    """Pallas kernel for `causal_conv1d_prefill_reference` (same arguments and results).

    Two launches: the conv over (token blocks, channel blocks), then the final windows over
    (rows, channel blocks), written into `conv_state` in place (aliased).
    """
    check_activation(activation)
    num_tokens, channels = x.shape
    width = check_common(channels, weight, bias, conv_state)
    num_rows = query_start_loc.shape[0] - 1
    qsl = query_start_loc.astype(jnp.int32)
    # Per-token metadata (T int32 each): where the token's row starts and which slot it reads.
    row, live = token_rows(qsl, num_tokens)
    start = jnp.where(live, qsl[row], num_tokens + 1)
    # The slot each token's window reads: NULL unless the row has a live initial state (an
    # out-of-range read slot reads zeros, never a clamped live slot).
    read = jnp.where(has_initial_state, safe_slot(read_slots, conv_state.shape[0]), 0)
    slot = jnp.where(live, read[row], 0).astype(jnp.int32)
    bias = jnp.zeros((channels,), jnp.float32) if bias is None else bias
    # Blocks may shrink with T: a token's taps are summed in the same order in any block, so this
    # does not make a row's result depend on the padded shape.
    block_t, block_d = min(pow2(block_t), pow2(num_tokens)), min(pow2(block_d), pow2(channels))
    params = plgpu.CompilerParams(num_warps=num_warps, num_stages=1)
    y = pl.pallas_call(
        functools.partial(
            _prefill_kernel,
            num_tokens=num_tokens,
            channels=channels,
            width=width,
            block_t=block_t,
            block_d=block_d,
            activation=activation,
            split_paths=split_paths,
        ),
        out_shape=sds_like(x),
        grid=(pl.cdiv(num_tokens, block_t), pl.cdiv(channels, block_d)),
        compiler_params=params,
        interpret=interpret,
        name="causal_conv1d_prefill",
    )(start, slot, x, weight, bias, conv_state)
    if width == 1:
        return y, conv_state
    conv_state = pl.pallas_call(
        functools.partial(_final_window_kernel, channels=channels, width=width, block_d=block_d),
        out_shape=sds_like(conv_state),
        grid=(num_rows, pl.cdiv(channels, block_d)),
        input_output_aliases={5: 0},
        compiler_params=params,
        interpret=interpret,
        name="causal_conv1d_final_window",
    )(
        qsl,
        has_initial_state.astype(jnp.int32),
        read_slots.astype(jnp.int32),
        write_slots.astype(jnp.int32),
        x,
        conv_state,
    )
    return y, conv_state


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
    read, num_slots = read_ref[b], state_ref.shape[0]
    seq = [
        plgpu.load(
            state_ref.at[safe_slot(read, num_slots), d_sl, jnp.int32(k)],
            mask=d_mask & live_slot(read, num_slots),
            other=0.0,
        ).astype(jnp.float32)
        for k in range(width - 1)
    ]
    loads_before_stores(on_gpu)  # lane 0 may write the slot it read (in place)
    taps, bias = _load_taps(w_ref, bias_ref, d_sl, d_mask, width)
    for t in range(lanes):
        tt = jnp.int32(t)
        seq.append(plgpu.load(x_ref.at[b, tt, d_sl], mask=d_mask, other=0.0).astype(jnp.float32))
        acc = bias
        for j in range(width):
            acc = acc + taps[j] * seq[t + j]
        y = silu(acc) if activation == "silu" else acc
        write = write_ref[b, tt]
        writes = live_slot(write, num_slots)
        plgpu.store(
            y_ref.at[b, tt, d_sl], jnp.where(writes, y, 0.0).astype(y_ref.dtype), mask=d_mask
        )
        for k in range(width - 1):
            plgpu.store(
                state_ref.at[safe_slot(write, num_slots), d_sl, jnp.int32(k)],
                seq[t + 1 + k].astype(state_ref.dtype),
                mask=d_mask & writes,
            )


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
