"""Mamba2 decode: the selective state update over rows of 1 + K tokens (speculative lanes).

Glossary: B decode rows, L = 1 + K lanes, H heads, P head dim, G groups, N state size, S slots.
Same recurrence as `ssd_chunk_scan`; the state after lane t goes to write_slots[b, t].
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from pallas_kernels._common import check_shape, gather_slots, process_dt, scatter_slots, silu


def check_args(x, dt, A, B, C, ssm_state, read_slots, write_slots, D, z, dt_bias):
    """Validate shapes; return (B, L, H, P, G, N)."""
    batch, lanes, heads, head_dim = x.shape
    groups, state_size = B.shape[2], B.shape[3]
    check_shape("dt", dt, (batch, lanes, heads))
    check_shape("A", A, (heads,))
    check_shape("B", B, (batch, lanes, None, None))
    check_shape("C", C, (batch, lanes, groups, state_size))
    check_shape("ssm_state", ssm_state, (None, heads, head_dim, state_size))
    check_shape("read_slots", read_slots, (batch,))
    check_shape("write_slots", write_slots, (batch, lanes))
    check_shape("D", D, (heads,))
    check_shape("z", z, x.shape)
    check_shape("dt_bias", dt_bias, (heads,))
    if groups < 1 or heads % groups:
        raise ValueError(f"B has {groups} groups; must divide the {heads} heads of x")
    return batch, lanes, heads, head_dim, groups, state_size


@functools.partial(jax.jit, static_argnames=("dt_softplus", "dt_limit"))
def ssd_state_update_reference(
    x: jax.Array,
    dt: jax.Array,
    A: jax.Array,
    B: jax.Array,
    C: jax.Array,
    ssm_state: jax.Array,
    read_slots: jax.Array,
    write_slots: jax.Array,
    *,
    D: jax.Array | None = None,
    z: jax.Array | None = None,
    dt_bias: jax.Array | None = None,
    dt_softplus: bool = True,
    dt_limit: tuple[float, float] = (0.0, float("inf")),
) -> tuple[jax.Array, jax.Array]:
    """x [B, L, H, P], dt [B, L, H], B/C [B, L, G, N], ssm_state [S, H, P, N] -> (y, ssm_state).

    The state before lane 0 is ssm_state[read_slots[b]] (zeros when <= 0). Lanes whose write slot is
    <= 0 output 0.
    """
    _, lanes, heads, _, groups, _ = check_args(
        x, dt, A, B, C, ssm_state, read_slots, write_slots, D, z, dt_bias
    )
    rep = heads // groups
    s = gather_slots(ssm_state, read_slots)  # [B, H, P, N]
    dtp = process_dt(dt, dt_bias, dt_softplus, dt_limit)  # [B, L, H]
    a = A.astype(jnp.float32)
    d_skip = jnp.zeros((heads,), jnp.float32) if D is None else D.astype(jnp.float32)
    ys, states = [], []
    for t in range(lanes):
        xt = x[:, t].astype(jnp.float32)  # [B, H, P]
        bt = jnp.repeat(B[:, t].astype(jnp.float32), rep, axis=1)  # [B, H, N]
        ct = jnp.repeat(C[:, t].astype(jnp.float32), rep, axis=1)
        decay = jnp.exp(dtp[:, t] * a)[:, :, None, None]
        s = decay * s + (dtp[:, t, :, None] * xt)[..., None] * bt[:, :, None, :]
        y = jnp.einsum("bhpn,bhn->bhp", s, ct, precision="highest") + d_skip[:, None] * xt
        if z is not None:
            y = y * silu(z[:, t].astype(jnp.float32))
        ys.append(y)
        states.append(s)
    y = jnp.stack(ys, axis=1)
    y = jnp.where((write_slots > 0)[:, :, None, None], y, 0.0).astype(x.dtype)
    return y, scatter_slots(ssm_state, write_slots, jnp.stack(states, axis=1))
