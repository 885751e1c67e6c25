"""Mamba2 decode: the selective state update over rows of 1 + K tokens (speculative lanes).

The kernel of `ssd_state_update_reference` (`ssd/reference.py`, with the glossary): the same
recurrence as the prefill scan; the state after lane t goes to write_slots[b, t]. Grid
(P / block_p, H, B): a row's tiles first (`_common.py`, "Decode launch order").
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plgpu

from pallas_kernels._common import (
    dt_activation,
    live_slot,
    loads_before_stores,
    pow2,
    safe_slot,
    sds_like,
    silu,
)
from pallas_kernels.ssd.reference import check_update_args


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
    pb, h, b = pl.program_id(0), pl.program_id(1), pl.program_id(2)
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
    batch, lanes, heads, head_dim, groups, state_size = check_update_args(
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
        grid=(pl.cdiv(head_dim, block_p), heads, batch),
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
