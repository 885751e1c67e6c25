"""The prefill kernels of `causal_conv1d_prefill` (private: call the public function).

Two interchangeable conv kernels write y: `tiled_kernel` computes [block_t, block_d] tiles, one
shifted load of x per tap; `walk_kernel` walks consecutive tokens keeping the window in registers,
one x row load per token. `final_window_kernel` then writes each row's last W - 1 inputs.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plgpu

from pallas_kernels._common import safe_slot, silu
from pallas_kernels._conv_window import load_taps, load_window, store_window, tap_sum


def tiled_kernel(
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
    taps, bias = load_taps(w_ref, bias_ref, d_sl, d_mask, width)
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


def window_before(x_ref, state_ref, t, local, slot, d_sl, d_mask, width):
    """The W - 1 inputs before token t, `local` tokens into its row (oldest first, fp32 [BD]): x
    where they lie in the row, else the row's initial window in `slot` (zero when NULL), zero for
    padding tokens (local < 0). t may be one past the row's last token (its final window)."""
    window = []
    for k in range(width - 1):
        back = width - 1 - k
        in_row = local >= back
        from_x = plgpu.load(
            x_ref.at[jnp.maximum(t - back, 0), d_sl], mask=d_mask & in_row, other=0.0
        ).astype(jnp.float32)
        from_init = plgpu.load(
            state_ref.at[slot, d_sl, jnp.clip(local + k, 0, width - 2)],
            mask=d_mask & (~in_row) & (local >= 0) & (slot > 0),
            other=0.0,
        ).astype(jnp.float32)
        window.append(jnp.where(in_row, from_x, from_init))
    return window


def walk_kernel(
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
    walk_tokens,
    unroll,
    block_d,
    activation,
):
    """One (token segment, channel block): walk the segment's tokens in order, one x row in and
    one y row out per token, the window kept as W - 1 fp32 register vectors.

    `unroll` tokens per loop step: their row loads are issued together so that several are in
    flight. The window is gathered once at the segment's first token. A segment inside one row
    (the common case: rows are long, segments short) then only shifts rows through the window;
    a segment that meets a row start or padding reads each token's row metadata and resets the
    window from the slot at every row start (a select fed by loads masked off elsewhere).
    """
    t0 = pl.program_id(0) * walk_tokens
    d_sl = pl.ds(pl.program_id(1) * block_d, block_d)
    d_mask = pl.program_id(1) * block_d + jnp.arange(block_d) < channels
    taps, bias = load_taps(w_ref, bias_ref, d_sl, d_mask, width)

    def token_meta(t):
        """(local, slot) of token t, local < 0 for padding tokens. A token past T reads token
        T - 1's (its loads and stores are masked off; the window it leaves is never used)."""
        index = jnp.minimum(t, num_tokens - 1)
        return t - start_ref[index], slot_ref[index]

    def conv_row(window, row, local):
        """y of one token from its window and row (zero for padding: local < 0), and the window
        the next token sees."""
        full = [*window, row.astype(jnp.float32)]
        y = tap_sum(taps, bias, full, activation)
        return (y if local is None else jnp.where(local >= 0, y, 0.0)), full[1:]

    def walk(one_row: bool):
        def step(g, window):
            ts = [t0 + g * unroll + i for i in range(unroll)]
            rows = [
                plgpu.load(x_ref.at[t, d_sl], mask=d_mask & (t < num_tokens), other=0.0) for t in ts
            ]
            for t, row in zip(ts, rows, strict=True):
                local = None
                if not one_row:
                    local, slot = token_meta(t)
                    is_start = local == 0
                    init = load_window(state_ref, slot, d_sl, d_mask, width, where=is_start)
                    window = [jnp.where(is_start, v, w) for v, w in zip(init, window, strict=True)]
                y, window = conv_row(window, row, local)
                plgpu.store(
                    y_ref.at[t, d_sl], y.astype(y_ref.dtype), mask=d_mask & (t < num_tokens)
                )
            return window

        local0, slot0 = token_meta(t0)
        first = window_before(x_ref, state_ref, t0, local0, slot0, d_sl, d_mask, width)
        jax.lax.fori_loop(0, walk_tokens // unroll, step, first)

    # One row: the first and last live tokens of the segment share a row start, and the first is
    # not padding (a row's tokens are contiguous, so every token between is in that row too).
    t_last = jnp.minimum(t0 + walk_tokens, num_tokens) - 1
    one_row = (start_ref[t0] == start_ref[t_last]) & (t0 >= start_ref[t0])
    pl.when(one_row)(lambda: walk(True))
    pl.when(~one_row)(lambda: walk(False))


def final_window_kernel(
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
    read = safe_slot(jnp.where(has_init_ref[r] != 0, read_ref[r], 0), num_slots)
    # Everything is loaded before anything is stored: the read and write slots may coincide.
    window = window_before(x_ref, state_ref, start + length, length, read, d_sl, d_mask, width)
    store_window(state_ref, write_ref[r], window, d_sl, d_mask)
