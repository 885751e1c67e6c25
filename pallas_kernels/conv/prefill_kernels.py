"""The prefill kernels of `causal_conv1d_prefill` (`conv/prefill.py` launches them).

`walk_kernel` writes y, walking consecutive tokens with the window in registers (one x row load
per token); `final_window_kernel` then writes each row's last W - 1 inputs. Both read the row
layout from `query_start_loc` itself: no per-token metadata is built before them.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plgpu

from pallas_kernels._common import pow2, safe_slot
from pallas_kernels.conv.window import load_taps, load_window, store_window, tap_sum


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


INT32_MAX = 2**31 - 1


def initial_slot(has_init_ref, read_ref, row, num_slots: int) -> jax.Array:
    """The slot row `row`'s initial window is read from: NULL unless it has a live initial
    state (an out-of-range read slot reads zeros, never a clamped live slot)."""
    return safe_slot(jnp.where(has_init_ref[row] != 0, read_ref[row], 0), num_slots)


class RowLookup:
    """Which row a flat token belongs to, from query_start_loc inside a kernel.

    The R row ends are loaded once as a vector (padded to a power of two with int32 max); a token's
    row is the number of ends at or before it, so empty rows are skipped and a token at or past
    the last end (padding) counts R.
    """

    def __init__(self, qsl_ref, has_init_ref, read_ref, num_rows: int, num_slots: int):
        lane = jnp.arange(max(2, pow2(num_rows)))
        self.ends = plgpu.load(  # qsl[1 + lane], indices kept inside the ref
            qsl_ref.at[jnp.minimum(lane + 1, num_rows)], mask=lane < num_rows, other=INT32_MAX
        )
        self.qsl_ref, self.has_init_ref, self.read_ref = qsl_ref, has_init_ref, read_ref
        self.num_rows, self.num_slots = num_rows, num_slots
        self.total = qsl_ref[num_rows]

    def count(self, t) -> jax.Array:
        """Row ends at or before token t: its row if t is live, R if it is padding."""
        return jnp.sum((self.ends <= t).astype(jnp.int32))

    def meta(self, t) -> tuple[jax.Array, jax.Array]:
        """(local, slot) of token t: its offset in its row (-1 for padding) and the slot its
        row's initial window is read from (NULL without a live initial state)."""
        row = jnp.minimum(self.count(t), self.num_rows - 1)
        live = t < self.total
        slot = jnp.where(
            live, initial_slot(self.has_init_ref, self.read_ref, row, self.num_slots), 0
        )
        return jnp.where(live, t - self.qsl_ref[row], -1), slot


def walk_kernel(
    qsl_ref,
    has_init_ref,
    read_ref,
    x_ref,
    w_ref,
    bias_ref,
    state_ref,
    y_ref,
    *,
    num_tokens,
    num_rows,
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
    a segment that meets a row start or padding looks up each token's row and resets the window
    from the slot at every row start (a select fed by loads masked off elsewhere).
    """
    t0 = pl.program_id(0) * walk_tokens
    d_sl = pl.ds(pl.program_id(1) * block_d, block_d)
    d_mask = pl.program_id(1) * block_d + jnp.arange(block_d) < channels
    taps, bias = load_taps(w_ref, bias_ref, d_sl, d_mask, width)
    rows = RowLookup(qsl_ref, has_init_ref, read_ref, num_rows, state_ref.shape[0])

    def conv_row(window, row, local):
        """y of one token from its window and row (zero for padding: local < 0), and the window
        the next token sees."""
        full = [*window, row.astype(jnp.float32)]
        y = tap_sum(taps, bias, full, activation)
        return (y if local is None else jnp.where(local >= 0, y, 0.0)), full[1:]

    def walk(one_row: bool):
        def step(g, window):
            ts = [t0 + g * unroll + i for i in range(unroll)]
            xs = [
                plgpu.load(x_ref.at[t, d_sl], mask=d_mask & (t < num_tokens), other=0.0) for t in ts
            ]
            for t, x in zip(ts, xs, strict=True):
                local = None
                if not one_row:
                    local, slot = rows.meta(t)
                    is_start = local == 0
                    init = load_window(state_ref, slot, d_sl, d_mask, width, where=is_start)
                    window = [jnp.where(is_start, v, w) for v, w in zip(init, window, strict=True)]
                y, window = conv_row(window, x, local)
                plgpu.store(
                    y_ref.at[t, d_sl], y.astype(y_ref.dtype), mask=d_mask & (t < num_tokens)
                )
            return window

        local0, slot0 = rows.meta(t0)
        first = window_before(x_ref, state_ref, t0, local0, slot0, d_sl, d_mask, width)
        jax.lax.fori_loop(0, walk_tokens // unroll, step, first)

    # One row: the segment's first and last real tokens lie in the same row and are both live (a
    # row's tokens are contiguous, so every token between is in that row too).
    t_last = jnp.minimum(t0 + walk_tokens, num_tokens) - 1
    one_row = (rows.count(t0) == rows.count(t_last)) & (t_last < rows.total)
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
    read = initial_slot(has_init_ref, read_ref, r, state_ref.shape[0])
    # Everything is loaded before anything is stored: the read and write slots may coincide.
    window = window_before(x_ref, state_ref, start + length, length, read, d_sl, d_mask, width)
    store_window(state_ref, write_ref[r], window, d_sl, d_mask)
