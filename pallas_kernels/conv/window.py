"""The window arithmetic every causal_conv1d kernel shares (private): weights per tap, one token's
tap sum, and a slot's W - 1 window loaded or stored as register vectors [BD] (oldest first).

Slots follow the NULL contract: a slot that is not live (<= 0 or past the pool) reads zeros and
writes nothing.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax.experimental.pallas import triton as plgpu

from pallas_kernels._common import live_slot, safe_slot, silu


def load_taps(w_ref, bias_ref, d_sl, d_mask, width):
    """Weight columns [BD] per tap (fp32) and the bias [BD]."""
    taps = [
        plgpu.load(w_ref.at[d_sl, jnp.int32(j)], mask=d_mask, other=0.0).astype(jnp.float32)
        for j in range(width)
    ]
    return taps, plgpu.load(bias_ref.at[d_sl], mask=d_mask, other=0.0).astype(jnp.float32)


def tap_sum(taps, bias, window, activation: str | None) -> jax.Array:
    """One token's output from its W inputs (oldest first): bias + sum of taps, then activation."""
    acc = bias
    for tap, value in zip(taps, window, strict=True):
        acc = acc + tap * value
    return silu(acc) if activation == "silu" else acc


def load_window(state_ref, slot, d_sl, d_mask, width, where=True) -> list[jax.Array]:
    """The W - 1 entries of `slot`'s window (fp32), loaded only `where` (a scalar)."""
    num_slots = state_ref.shape[0]
    return [
        plgpu.load(
            state_ref.at[safe_slot(slot, num_slots), d_sl, jnp.int32(k)],
            mask=d_mask & live_slot(slot, num_slots) & where,
            other=0.0,
        ).astype(jnp.float32)
        for k in range(width - 1)
    ]


def store_window(state_ref, slot, window, d_sl, d_mask) -> None:
    """Write the W - 1 vectors of `window` into `slot` (nothing when it is not live)."""
    num_slots = state_ref.shape[0]
    for k, value in enumerate(window):
        plgpu.store(
            state_ref.at[safe_slot(slot, num_slots), d_sl, jnp.int32(k)],
            value.astype(state_ref.dtype),
            mask=d_mask & live_slot(slot, num_slots),
        )
