"""Plain-jnp references of the causal depthwise conv1d ops, and the input checks they share with
the kernels.

Glossary: T flat tokens, R prefill rows, B decode rows, L lanes per decode row, S state slots,
D channels, W conv width. The conv state of a slot is the window of the last W - 1 inputs, oldest
first. Tap j of a token reads the input W - 1 - j tokens before it:
    y_t = act(bias + sum_j weight[:, j] * xx[t + j]),   xx = initial window ++ the row's tokens

- `causal_conv1d_prefill_reference`: ragged `Rows`, each row's final window to its write slot;
- `causal_conv1d_update_reference`: 1 + K decode lanes, the window after lane t to its own slot;
- `causal_conv1d_boundary_states`: prefix caching's windows at state-block boundaries inside the
  prefill rows. It has no kernel: this gather and scatter is the op on every platform.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from pallas_kernels._common import (
    check_shape,
    gather_slots,
    live_slot,
    scatter_slots,
    silu,
    token_rows,
)
from pallas_kernels.rows import Rows


def check_activation(activation: str | None) -> None:
    if activation not in ("silu", None):
        raise ValueError(f"activation={activation!r} must be 'silu' or None")


def finish(acc: jax.Array, bias: jax.Array | None, activation: str | None) -> jax.Array:
    if bias is not None:
        acc = acc + bias.astype(jnp.float32)
    return silu(acc) if activation == "silu" else acc


def check_common(x_channels, weight, bias, conv_state) -> int:
    d = x_channels
    check_shape("weight", weight, (d, None))
    width = weight.shape[1]
    check_shape("bias", bias, (d,))
    check_shape("conv_state", conv_state, (None, d, width - 1))
    return width


def check_prefill_args(x, weight, bias, conv_state, rows: Rows, activation) -> tuple[int, int]:
    """Validate the prefill conv's shapes and activation; return (W, R)."""
    check_activation(activation)
    check_shape("x", x, (None, None))
    width = check_common(x.shape[1], weight, bias, conv_state)
    return width, rows.check()


def check_update_args(x, weight, bias, conv_state, read_slots, write_slots, activation) -> int:
    """Validate the decode conv's shapes and activation; return W."""
    check_activation(activation)
    batch, lanes, channels = x.shape
    width = check_common(channels, weight, bias, conv_state)
    check_shape("read_slots", read_slots, (batch,))
    check_shape("write_slots", write_slots, (batch, lanes))
    return width


@functools.partial(jax.jit, static_argnames=("activation",))
def causal_conv1d_prefill_reference(
    x: jax.Array,
    weight: jax.Array,
    bias: jax.Array | None,
    conv_state: jax.Array,
    rows: Rows,
    *,
    activation: str | None = "silu",
) -> tuple[jax.Array, jax.Array]:
    """Varlen causal conv1d. x [T, D], weight [D, W], conv_state [S, D, W-1] -> (y [T, D], pool).

    Row r is x[query_start_loc[r]:query_start_loc[r+1]] preceded by its initial window `init[r]`
    (conv_state[read_slots[r]] if has_initial_state[r], else zeros). Tap j of token i of the row
    reads xx[i + j] where xx = init[r] ++ row tokens. The last W - 1 entries of xx
    go to write_slots[r]. `rows.num_computed` and the boundary slots are not read: the windows at
    block boundaries come from `causal_conv1d_boundary_states`.
    """
    width, num_rows = check_prefill_args(x, weight, bias, conv_state, rows, activation)
    num_tokens, channels = x.shape
    query_start_loc = rows.query_start_loc

    init = gather_slots(conv_state, rows.read_slots, rows.has_initial_state)  # [R, D, W-1]
    xf = x.astype(jnp.float32)
    row, live = token_rows(query_start_loc, num_tokens)
    start = query_start_loc[row]
    local = jnp.arange(num_tokens, dtype=jnp.int32) - start  # position of token in its row

    def xx(r: jax.Array, i: jax.Array, base: jax.Array) -> jax.Array:
        """Entry i of init[r] ++ row tokens (row r starts at flat index base): [..., D]."""
        from_x = xf[jnp.clip(base + i - (width - 1), 0, num_tokens - 1)]
        from_init = init[r, :, jnp.clip(i, 0, width - 2)] if width > 1 else from_x
        return jnp.where((i < width - 1)[..., None], from_init, from_x)

    acc = jnp.zeros((num_tokens, channels), jnp.float32)
    for j in range(width):
        acc = acc + xx(row, local + j, start) * weight[:, j].astype(jnp.float32)
    y = jnp.where(live[:, None], finish(acc, bias, activation), 0.0).astype(x.dtype)

    # Final windows: entries len_r .. len_r + W - 2 of xx for each row.
    row_index = jnp.arange(num_rows, dtype=jnp.int32)
    lengths = query_start_loc[1:] - query_start_loc[:-1]
    k = jnp.arange(width - 1, dtype=jnp.int32)
    windows = xx(row_index[:, None], lengths[:, None] + k[None, :], query_start_loc[:-1, None])
    conv_state = scatter_slots(conv_state, rows.write_slots, jnp.swapaxes(windows, 1, 2))
    return y, conv_state


@functools.partial(jax.jit, static_argnames=("activation",))
def causal_conv1d_update_reference(
    x: jax.Array,
    weight: jax.Array,
    bias: jax.Array | None,
    conv_state: jax.Array,
    read_slots: jax.Array,
    write_slots: jax.Array,
    *,
    activation: str | None = "silu",
) -> tuple[jax.Array, jax.Array]:
    """Decode conv over L = 1 + K lanes. x [B, L, D], conv_state [S, D, W-1] -> (y [B, L, D], pool).

    Lane t sees the window conv_state[read_slots[b]] ++ x[b, :t+1]; the window after lane t goes to
    write_slots[b, t] when live. Lanes whose write slot is not live (<= 0 or >= S) are dead and
    output 0.
    """
    width = check_update_args(x, weight, bias, conv_state, read_slots, write_slots, activation)
    batch, lanes, channels = x.shape

    init = gather_slots(conv_state, read_slots)  # [B, D, W-1]
    xx = jnp.concatenate([init, jnp.swapaxes(x.astype(jnp.float32), 1, 2)], axis=2)  # [B, D, W-1+L]
    acc = jnp.zeros((batch, lanes, channels), jnp.float32)
    for j in range(width):
        acc = acc + jnp.swapaxes(xx[:, :, j : j + lanes], 1, 2) * weight[:, j].astype(jnp.float32)
    live = live_slot(write_slots, conv_state.shape[0])[..., None]
    y = jnp.where(live, finish(acc, bias, activation), 0.0).astype(x.dtype)

    # Window after lane t: xx[:, :, t+1 : t+W].
    idx = jnp.arange(lanes)[:, None] + 1 + jnp.arange(width - 1)[None, :]  # [L, W-1]
    windows = jnp.moveaxis(xx[:, :, idx], 1, 2)  # [B, D, L, W-1] -> [B, L, D, W-1]
    conv_state = scatter_slots(conv_state, write_slots, windows)
    return y, conv_state


@jax.jit
def causal_conv1d_boundary_states(x: jax.Array, conv_state: jax.Array, rows: Rows) -> jax.Array:
    """Conv windows at state-block boundaries inside prefill rows, for prefix caching (plain jnp: a
    small gather and scatter, the implementation on every platform).

    x [T, D] (the conv's input), conv_state [S, D, W-1]. Boundary j of row r is the absolute
    position P = (num_computed[r] // block_size + j + 1) * block_size; when it falls inside the
    row (P <= num_computed[r] + its length) and rows.boundary_slots[r, j] is live, the window of
    the last W - 1 inputs before P (xx entries P - nc .. P - nc + W - 2, xx = the row's initial
    window ++ its tokens, as in `causal_conv1d_prefill_reference`) is written to that slot. Near
    the row start the window reaches into the initial window, so this must read the pool before
    the prefill conv overwrites the row's read slot: call it first (boundary slots are never read
    in the same step). Without boundary slots nothing is written. Returns the updated pool.
    """
    num_tokens, channels = x.shape
    span = conv_state.shape[2]  # W - 1
    check_shape("conv_state", conv_state, (None, channels, None))
    num_rows = rows.check()
    if rows.boundary_slots is None:
        return conv_state
    nb = rows.boundary_slots.shape[1]
    if span == 0 or nb == 0:
        return conv_state
    query_start_loc, block_size = rows.query_start_loc, rows.need_block_size()
    init = gather_slots(conv_state, rows.read_slots, rows.has_initial_state)  # [R, D, W-1] fp32
    nc = rows.num_computed[:, None]
    before = (nc // block_size + 1 + jnp.arange(nb)[None, :]) * block_size - nc  # [R, NB] tokens
    lengths = (query_start_loc[1:] - query_start_loc[:-1])[:, None]
    slots = jnp.where(before <= lengths, rows.boundary_slots, 0)
    i = before[:, :, None] + jnp.arange(span)[None, None, :]  # [R, NB, W-1] index into xx
    flat = jnp.clip(query_start_loc[:-1, None, None] + i - span, 0, num_tokens - 1)
    from_x = x.astype(jnp.float32)[flat]  # [R, NB, W-1, D]
    row_index = jnp.arange(num_rows)[:, None, None]
    from_init = jnp.moveaxis(init, 1, 2)[row_index, jnp.clip(i, 0, span - 1)]  # [R, NB, W-1, D]
    windows = jnp.where((i < span)[..., None], from_init, from_x)
    return scatter_slots(conv_state, slots, jnp.swapaxes(windows, -1, -2))
