"""Plain-jnp reference of the Mamba2 SSD prefill scan (the token recurrence) and its input checks.

See `ssd_chunk_scan.py` for the op's contract and shapes.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from pallas_kernels._common import (
    check_int,
    check_shape,
    gather_slots,
    process_dt,
    scatter_slots,
    silu,
    token_rows,
)

ALGORITHMS = ("sequential", "parallel")


def check_args(
    x,
    dt,
    A,
    B,
    C,
    ssm_state,
    query_start_loc,
    num_computed,
    has_initial_state,
    read_slots,
    write_slots,
    D,
    z,
    dt_bias,
    chunk_size,
    block_size,
    boundary_slots,
    algorithm,
):
    """Validate shapes and options; return (T, H, P, G, N, R)."""
    num_tokens, heads, head_dim = x.shape
    groups, state_size = B.shape[1], B.shape[2]
    num_rows = query_start_loc.shape[0] - 1
    check_shape("dt", dt, (num_tokens, heads))
    check_shape("A", A, (heads,))
    check_shape("B", B, (num_tokens, None, None))
    check_shape("C", C, (num_tokens, groups, state_size))
    check_shape("ssm_state", ssm_state, (None, heads, head_dim, state_size))
    for name, a in (
        ("num_computed", num_computed),
        ("has_initial_state", has_initial_state),
        ("read_slots", read_slots),
        ("write_slots", write_slots),
    ):
        check_shape(name, a, (num_rows,))
    check_shape("D", D, (heads,))
    check_shape("z", z, x.shape)
    check_shape("dt_bias", dt_bias, (heads,))
    if groups < 1 or heads % groups:
        raise ValueError(f"B has {groups} groups; must divide the {heads} heads of x")
    check_int("chunk_size", chunk_size, 1)
    if algorithm not in ALGORITHMS:
        raise ValueError(f"algorithm={algorithm!r} must be one of {ALGORITHMS}")
    if (block_size is None) != (boundary_slots is None):
        raise ValueError("block_size and boundary_slots must be given together")
    if block_size is not None:
        if block_size % chunk_size:
            raise ValueError(
                f"block_size={block_size} must be a multiple of chunk_size={chunk_size}"
            )
        check_shape("boundary_slots", boundary_slots, (num_rows, None))
    return num_tokens, heads, head_dim, groups, state_size, num_rows


@functools.partial(
    jax.jit, static_argnames=("dt_softplus", "dt_limit", "chunk_size", "block_size", "algorithm")
)
def ssd_chunk_scan_reference(
    x: jax.Array,
    dt: jax.Array,
    A: jax.Array,
    B: jax.Array,
    C: jax.Array,
    ssm_state: jax.Array,
    query_start_loc: jax.Array,
    num_computed: jax.Array,
    has_initial_state: jax.Array,
    read_slots: jax.Array,
    write_slots: jax.Array,
    *,
    D: jax.Array | None = None,
    z: jax.Array | None = None,
    dt_bias: jax.Array | None = None,
    dt_softplus: bool = True,
    dt_limit: tuple[float, float] = (0.0, float("inf")),
    chunk_size: int = 256,
    block_size: int | None = None,
    boundary_slots: jax.Array | None = None,
    algorithm: str = "sequential",
) -> tuple[jax.Array, jax.Array]:
    """The definition, one token at a time. x [T, H, P] -> (y [T, H, P], ssm_state [S, H, P, N]).

    One lax.scan over the flat tokens carries the state, resets it to the row's initial state at
    each row start, and writes the final state (and the block-boundary states) into the pool as it
    goes.
    `chunk_size` and `algorithm` (which kernel runs on the GPU) do not change the result of this
    definition; they are only validated.
    """
    num_tokens, heads, _, groups, _, num_rows = check_args(
        x,
        dt,
        A,
        B,
        C,
        ssm_state,
        query_start_loc,
        num_computed,
        has_initial_state,
        read_slots,
        write_slots,
        D,
        z,
        dt_bias,
        chunk_size,
        block_size,
        boundary_slots,
        algorithm,
    )
    rep = heads // groups
    init = gather_slots(ssm_state, read_slots, has_initial_state)  # [R, H, P, N]
    lengths = query_start_loc[1:] - query_start_loc[:-1]
    # Rows without tokens still publish their (initial) state.
    pool = scatter_slots(ssm_state, jnp.where(lengths == 0, write_slots, 0), init)

    row, live = token_rows(query_start_loc, num_tokens)
    local = jnp.arange(num_tokens, dtype=jnp.int32) - query_start_loc[row]
    dtp = process_dt(dt, dt_bias, dt_softplus, dt_limit)  # [T, H]
    a = A.astype(jnp.float32)
    d_skip = jnp.zeros((heads,), jnp.float32) if D is None else D.astype(jnp.float32)
    no_slot = jnp.int32(pool.shape[0])

    def step(carry, t):
        s, pool = carry
        r = row[t]
        s = jnp.where(local[t] == 0, init[r], s)
        xt = x[t].astype(jnp.float32)  # [H, P]
        bt = jnp.repeat(B[t].astype(jnp.float32), rep, axis=0)  # [H, N]
        ct = jnp.repeat(C[t].astype(jnp.float32), rep, axis=0)
        s = (
            jnp.exp(dtp[t] * a)[:, None, None] * s
            + (dtp[t][:, None] * xt)[:, :, None] * bt[:, None, :]
        )
        y = jnp.einsum("hpn,hn->hp", s, ct, precision="highest") + d_skip[:, None] * xt
        if z is not None:
            y = y * silu(z[t].astype(jnp.float32))
        y = jnp.where(live[t], y, 0.0)
        last = live[t] & (local[t] == lengths[r] - 1) & (write_slots[r] > 0)
        pool = pool.at[jnp.where(last, write_slots[r], no_slot)].set(
            s.astype(pool.dtype), mode="drop"
        )
        if block_size is not None:
            pos = num_computed[r] + local[t]
            j = (pos + 1) // block_size - num_computed[r] // block_size - 1
            jc = jnp.clip(j, 0, boundary_slots.shape[1] - 1)
            slot = boundary_slots[r, jc]
            hit = (
                live[t] & ((pos + 1) % block_size == 0) & (j < boundary_slots.shape[1]) & (slot > 0)
            )
            pool = pool.at[jnp.where(hit, slot, no_slot)].set(s.astype(pool.dtype), mode="drop")
        return (s, pool), y

    s0 = jnp.zeros(ssm_state.shape[1:], jnp.float32)
    (_, pool), y = jax.lax.scan(step, (s0, pool), jnp.arange(num_tokens, dtype=jnp.int32))
    return y.astype(x.dtype), pool
