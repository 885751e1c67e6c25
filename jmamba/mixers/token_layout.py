"""Views of the flat token axis of `StepInputs`: the decode section and the prefill section."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp

from jmamba.step.pytree import StepInputs


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


def run_by_section(
    inputs: StepInputs,
    state: Any,
    decode_streams: tuple[jax.Array, ...],
    prefill_streams: tuple[jax.Array, ...],
    decode: Callable[..., tuple[jax.Array, Any]],
    prefill: Callable[..., tuple[jax.Array, Any]],
    out_tail: tuple[int, ...],
    dtype: jnp.dtype,
) -> tuple[jax.Array, Any]:
    """Run a recurrent mixer's decode path on the decode section of `decode_streams` and its
    prefill path on the prefill section of `prefill_streams` ([T, ...] arrays each: a path may
    read the projection whole while the other reads its split columns), threading the state pools
    through both.

    `decode(*decode_sections, state)` returns (y [R_d, W, *out_tail], state) and
    `prefill(*prefill_sections, state)` returns (y [T_p, *out_tail], state); an empty section (a
    decode-only or prefill-only step variant) is skipped. Returns (y [T, *out_tail], state).
    """
    y_decode = jnp.zeros((inputs.decode.num_rows, inputs.decode.width, *out_tail), dtype)
    y_prefill = jnp.zeros((inputs.num_prefill_tokens, *out_tail), dtype)
    if inputs.decode.num_rows:
        sections = (split_sections(stream, inputs)[0] for stream in decode_streams)
        y_decode, state = decode(*sections, state)
    if inputs.num_prefill_tokens:
        sections = (split_sections(stream, inputs)[1] for stream in prefill_streams)
        y_prefill, state = prefill(*sections, state)
    return join_sections(y_decode, y_prefill), state
