"""Views of the flat token axis of `StepInputs`: the decode section and the prefill section."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from jmamba.inputs import StepInputs


def split_sections(x: jax.Array, inputs: StepInputs) -> tuple[jax.Array, jax.Array]:
    """[T, ...] -> (decode lanes [R_d, W, ...], prefill tokens [T_p, ...])."""
    d = inputs.num_decode_tokens
    decode = x[:d].reshape(inputs.decode.num_rows, inputs.decode.width, *x.shape[1:])
    return decode, x[d:]


def join_sections(decode: jax.Array, prefill: jax.Array) -> jax.Array:
    """Inverse of `split_sections`."""
    flat = decode.reshape(-1, *decode.shape[2:])
    return jnp.concatenate([flat, prefill.astype(flat.dtype)], axis=0)


def decode_lane_valid(inputs: StepInputs) -> jax.Array:
    """[R_d, W] bool: lane t of row r is live (t < query_lens[r])."""
    lanes = jnp.arange(inputs.decode.width)[None, :]
    return lanes < inputs.decode.query_lens[:, None]


def prefill_token_rows(inputs: StepInputs) -> tuple[jax.Array, jax.Array]:
    """([T_p] row of each prefill token, [T_p] bool live); padding tokens get row 0, live False."""
    qsl = inputs.prefill.query_start_loc
    t = jnp.arange(inputs.num_prefill_tokens)
    rows = jnp.searchsorted(qsl, t, side="right") - 1
    live = t < qsl[-1]
    return jnp.where(live, jnp.clip(rows, 0, inputs.prefill.num_rows - 1), 0), live
