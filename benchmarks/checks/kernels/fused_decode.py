"""The case both fused decode ops share (`mamba2_decode`, `gdn_decode`): conv window and recurrent
state travel packed into one fp32 pool, so the judge checks both."""

from __future__ import annotations

import functools
from collections.abc import Callable

import jax.numpy as jnp
import numpy as np

from benchmarks.checks.kernels.case import F32, TOLERANCE, Case
from benchmarks.checks.kernels.layouts import lane_live, lanes, normal, random_pool


def fused_decode_case(
    rng,
    fns: tuple[Callable, Callable],
    columns: int,
    conv_tail: tuple[int, int],
    state_tail: tuple[int, ...],
    after: tuple,
    num_lanes: int,
    dtype,
    batch: int,
) -> Case:
    """A fused decode op `fn(mixed, weight, bias, conv_state, state, *after, read, write)`. Its two
    pools travel packed into one fp32 [S, conv + state] array, so the judge checks both (a bf16
    conv window round-trips through fp32 exactly)."""
    read, write, num_slots = lanes(rng, batch, num_lanes)
    split = conv_tail[0] * conv_tail[1]

    def call(fn, mixed, weight, bias, packed, *rest, **kw):
        conv_state = packed[:, :split].reshape(-1, *conv_tail).astype(dtype)
        state = packed[:, split:].reshape(-1, *state_tail)
        out, conv_state, state = fn(mixed, weight, bias, conv_state, state, *rest, **kw)
        flat = (
            conv_state.astype(F32).reshape(packed.shape[0], -1),
            state.reshape(packed.shape[0], -1),
        )
        return out, jnp.concatenate(flat, axis=1)

    conv_pool = np.asarray(random_pool(rng, num_slots, conv_tail, dtype), np.float32)
    state_pool = random_pool(rng, num_slots, state_tail, F32)
    packed = np.concatenate([p.reshape(num_slots, -1) for p in (conv_pool, state_pool)], axis=1)
    channels, width = conv_tail[0], conv_tail[1] + 1
    args = (
        normal(rng, (batch, num_lanes, columns), dtype),
        normal(rng, (channels, width), dtype, width**-0.5),
        normal(rng, (channels,), dtype, 0.1),
        packed,
        *after,
        read,
        write,
    )
    return Case(
        functools.partial(call, fns[0]),
        functools.partial(call, fns[1]),
        args,
        3,
        lane_live(write, 2),
        write.ravel(),
        TOLERANCE[dtype, "update"],
        f"B={batch} L={num_lanes}",
    )
