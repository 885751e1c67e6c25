"""Mamba2 decode: the selective state update over rows of 1 + K tokens (speculative lanes).

Glossary: B decode rows, L = 1 + K lanes, H heads, P head dim, G groups, N state size, S slots.
Same recurrence as `ssd_chunk_scan`; the state after lane t goes to write_slots[b, t].
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plgpu

from pallas_kernels._common import (
    check_shape,
    dt_activation,
    gather_slots,
    live_slot,
    loads_before_stores,
    pow2,
    process_dt,
    safe_slot,
    scatter_slots,
    sds_like,
    silu,
)


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

    The state before lane 0 is ssm_state[read_slots[b]] (zeros when the slot is not live: <= 0 or
    >= S). Lanes whose write slot is not live output 0 and write nothing.
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
    live = live_slot(write_slots, ssm_state.shape[0])
    y = jnp.where(live[:, :, None, None], y, 0.0).astype(x.dtype)
    return y, scatter_slots(ssm_state, write_slots, jnp.stack(states, axis=1))


def _ssu_kernel(
    read_ref,
    write_ref,
    x_ref,
    dt_ref,
    a_ref,
    b_ref,
    c_ref,
    d_ref,
    z_ref,
    bias_ref,
    state_in_ref,
    y_ref,
    state_ref,
    *,
    lanes,
    heads_per_group,
    head_dim,
    state_size,
    block_p,
    block_n,
    dt_softplus,
    dt_limit,
    has_z,
    on_gpu,
):
    """One (row, head, P-block): the state block stays in registers across the row's lanes."""
    del state_in_ref  # aliased to state_ref
    b, h, pb = pl.program_id(0), pl.program_id(1), pl.program_id(2)
    g = h // heads_per_group
    p_idx = pb * block_p + jnp.arange(block_p)
    p_mask, n_mask = p_idx < head_dim, jnp.arange(block_n) < state_size
    pn_mask = p_mask[:, None] & n_mask[None, :]
    p_sl, n_sl = pl.ds(pb * block_p, block_p), pl.ds(0, block_n)
    read, num_slots = read_ref[b], state_ref.shape[0]
    s = plgpu.load(
        state_ref.at[safe_slot(read, num_slots), h, p_sl, n_sl],
        mask=pn_mask & live_slot(read, num_slots),
        other=0.0,
    ).astype(jnp.float32)
    loads_before_stores(on_gpu)  # lane 0 may write the slot it read (in place)
    a, d_skip, bias = a_ref[h].astype(jnp.float32), d_ref[h], bias_ref[h]
    for t in range(lanes):
        t = jnp.int32(t)  # a traced index (interpret mode rejects Python ints in .at[])
        x = plgpu.load(x_ref.at[b, t, h, p_sl], mask=p_mask, other=0.0).astype(jnp.float32)
        dt = dt_ref[b, t, h].astype(jnp.float32) + bias.astype(jnp.float32)
        dt = dt_activation(dt, dt_softplus, dt_limit)
        bv = plgpu.load(b_ref.at[b, t, g, n_sl], mask=n_mask, other=0.0).astype(jnp.float32)
        cv = plgpu.load(c_ref.at[b, t, g, n_sl], mask=n_mask, other=0.0).astype(jnp.float32)
        s = s * jnp.exp(dt * a) + (dt * x)[:, None] * bv[None, :]
        y = jnp.sum(s * cv[None, :], axis=1) + d_skip.astype(jnp.float32) * x
        if has_z:
            y = y * silu(
                plgpu.load(z_ref.at[b, t, h, p_sl], mask=p_mask, other=0.0).astype(jnp.float32)
            )
        write = write_ref[b, t]
        writes = live_slot(write, num_slots)
        y = jnp.where(writes, y, 0.0)
        plgpu.store(y_ref.at[b, t, h, p_sl], y.astype(y_ref.dtype), mask=p_mask)
        plgpu.store(
            state_ref.at[safe_slot(write, num_slots), h, p_sl, n_sl],
            s.astype(state_ref.dtype),
            mask=pn_mask & writes,
        )


@functools.partial(
    jax.jit,
    static_argnames=("dt_softplus", "dt_limit", "interpret", "block_p", "num_warps", "num_stages"),
)
def ssd_state_update(
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
    interpret: bool = False,
    block_p: int = 32,
    num_warps: int = 4,
    num_stages: int = 1,
) -> tuple[jax.Array, jax.Array]:
    """Pallas kernel for `ssd_state_update_reference` (same arguments and results).

    Grid (B, H, P / block_p). The state is read from and written to its slots inside the kernel;
    `ssm_state` is aliased to the returned pool (donate it under jit to update in place).
    """
    batch, lanes, heads, head_dim, groups, state_size = check_args(
        x, dt, A, B, C, ssm_state, read_slots, write_slots, D, z, dt_bias
    )
    block_p = min(pow2(block_p), pow2(head_dim))
    zeros = jnp.zeros((heads,), jnp.float32)
    kernel = functools.partial(
        _ssu_kernel,
        lanes=lanes,
        heads_per_group=heads // groups,
        head_dim=head_dim,
        state_size=state_size,
        block_p=block_p,
        block_n=pow2(state_size),
        dt_softplus=dt_softplus,
        dt_limit=tuple(dt_limit),
        has_z=z is not None,
        on_gpu=not interpret,
    )
    return pl.pallas_call(
        kernel,
        out_shape=(sds_like(x), sds_like(ssm_state)),
        grid=(batch, heads, pl.cdiv(head_dim, block_p)),
        input_output_aliases={10: 1},
        compiler_params=plgpu.CompilerParams(num_warps=num_warps, num_stages=num_stages),
        interpret=interpret,
        name="ssd_state_update",
    )(
        read_slots.astype(jnp.int32),
        write_slots.astype(jnp.int32),
        x,
        dt,
        A,
        B,
        C,
        zeros if D is None else D,
        x if z is None else z,
        zeros if dt_bias is None else dt_bias,
        ssm_state,
    )
