"""Mamba2 decode, fused: causal conv update + selective state update, reading in_proj's output.

Glossary: B decode rows, L = 1 + K lanes, H heads, P head dim, G groups, N state size, W conv
width, S slots; d_inner = H P, conv_dim = d_inner + 2 G N.

    zxbcdt      [B, L, d_inner + conv_dim + H]   in_proj's output: [z | xBC | dt], xBC = [x | B | C]
    conv_weight [conv_dim, W], conv_bias [conv_dim] or None, conv_state [S, conv_dim, W - 1]
    ssm_state   [S, H, P, N] (fp32), A / D / dt_bias [H] (fp32)
    -> y [B, L, H, P] (zxbcdt's dtype; before the gated norm, z is not read), conv_state, ssm_state

The result is `mamba2_decode_reference` (`ssd/reference.py`): `causal_conv1d_update(xBC,
activation="silu")` followed by `ssd_state_update` on the split x / B / C (D, dt_bias, softplus,
dt_limit). The conv output is rounded to zxbcdt's dtype, as the unfused path materialises it, so
the two agree to fp32 reassociation. The window and the state
after lane t go to write_slots[b, t]; a slot that is not live (<= 0 or >= S) reads zeros and writes
nothing, and its lanes output 0.

Two launches, reading zxbcdt by column offset (no slice is materialised):
1. `_conv_kernel`, grid (conv_dim / block_c, B): the conv of every xBC column, once per row (not
   once per head), writing their windows and a small [B, L, conv_dim] buffer (at B = 256 and the
   bench model's layer, 3 MB beside the state's 1 GB read and written).
2. `_ssm_kernel`, grid (P / block_p, H, B): the state update, reading x, B and C from the buffer.
No conv runs inside launch 2. B and C cannot: every head of a group reads the group's B/C
windows and one of them must write them, but a one-token decode updates its slot in place
(write slot == read slot), so that write would race with the other heads' reads; launch order
makes it safe. x could (each head owns its columns), but there it delays the program's state
loads: launch 2 then moved less of the DRAM bandwidth than the plain state update, at the same
grid and occupancy (Nsight Compute, benchmarks/results/README.md).
Each grid lists a row's tiles first: see `pallas_kernels/_common.py`, "Decode launch order".
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plgpu

from pallas_kernels._common import (
    conv_update_lanes,
    dt_activation,
    live_slot,
    loads_before_stores,
    pow2,
    safe_slot,
    sds_like,
)
from pallas_kernels.ssd.reference import Geometry, check_decode_args


def _conv_kernel(
    read_ref,
    write_ref,
    zx_ref,
    w_ref,
    bias_ref,
    conv_in_ref,
    xbc_ref,
    conv_ref,
    *,
    geo: Geometry,
    block_c: int,
    on_gpu: bool,
):
    """One (row, block of xBC channels): their conv; windows and xbc [B, L, conv_dim] out."""
    del conv_in_ref  # aliased to conv_ref
    start, b = pl.program_id(0) * block_c, pl.program_id(1)
    mask = start + jnp.arange(block_c) < geo.conv_dim
    outs = conv_update_lanes(
        read_ref,
        write_ref,
        zx_ref,
        w_ref,
        bias_ref,
        conv_ref,
        row=b,
        channel=pl.ds(start, block_c),
        column=pl.ds(geo.d_inner + start, block_c),
        mask=mask,
        lanes=geo.lanes,
        width=geo.width,
        on_gpu=on_gpu,
        dtype=xbc_ref.dtype,
    )
    for t, out in enumerate(outs):
        plgpu.store(
            xbc_ref.at[b, jnp.int32(t), pl.ds(start, block_c)],
            out.astype(xbc_ref.dtype),
            mask=mask,
        )


def _ssm_kernel(
    read_ref,
    write_ref,
    zx_ref,
    xbc_ref,
    a_ref,
    d_ref,
    dt_bias_ref,
    ssm_in_ref,
    y_ref,
    ssm_ref,
    *,
    geo: Geometry,
    block_p: int,
    dt_softplus: bool,
    dt_limit: tuple[float, float],
    on_gpu: bool,
):
    """One (row, head, P-block): the state update with the state block in registers across the
    row's lanes, x, B and C read from launch 1's buffer."""
    del ssm_in_ref  # aliased to ssm_ref
    pb, h, b = pl.program_id(0), pl.program_id(1), pl.program_id(2)
    g = h // (geo.heads // geo.groups)
    block_n = pow2(geo.state_size)
    p0 = pb * block_p
    p_mask = p0 + jnp.arange(block_p) < geo.head_dim
    n_mask = jnp.arange(block_n) < geo.state_size
    pn_mask = p_mask[:, None] & n_mask[None, :]
    x_sl = pl.ds(h * geo.head_dim + p0, block_p)
    read, num_slots = read_ref[b], ssm_ref.shape[0]
    p_sl, n_sl = pl.ds(p0, block_p), pl.ds(0, block_n)
    s = plgpu.load(
        ssm_ref.at[safe_slot(read, num_slots), h, p_sl, n_sl],
        mask=pn_mask & live_slot(read, num_slots),
        other=0.0,
    ).astype(jnp.float32)
    loads_before_stores(on_gpu)
    a, d_skip = a_ref[h].astype(jnp.float32), d_ref[h].astype(jnp.float32)
    dt_bias = dt_bias_ref[h].astype(jnp.float32)
    dt_col = geo.d_inner + geo.conv_dim + h
    b_sl = pl.ds(geo.d_inner + g * geo.state_size, block_n)
    c_sl = pl.ds(geo.d_inner + geo.bc_dim // 2 + g * geo.state_size, block_n)
    for t in range(geo.lanes):
        tt = jnp.int32(t)
        x = plgpu.load(xbc_ref.at[b, tt, x_sl], mask=p_mask, other=0.0).astype(jnp.float32)
        dt = dt_activation(
            zx_ref[b, tt, dt_col].astype(jnp.float32) + dt_bias, dt_softplus, dt_limit
        )
        bv = plgpu.load(xbc_ref.at[b, tt, b_sl], mask=n_mask, other=0.0).astype(jnp.float32)
        cv = plgpu.load(xbc_ref.at[b, tt, c_sl], mask=n_mask, other=0.0).astype(jnp.float32)
        s = s * jnp.exp(dt * a) + (dt * x)[:, None] * bv[None, :]
        y = jnp.sum(s * cv[None, :], axis=1) + d_skip * x
        write = write_ref[b, tt]
        writes = live_slot(write, num_slots)
        plgpu.store(
            y_ref.at[b, tt, h, p_sl], jnp.where(writes, y, 0.0).astype(y_ref.dtype), mask=p_mask
        )
        plgpu.store(
            ssm_ref.at[safe_slot(write, num_slots), h, p_sl, n_sl],
            s.astype(ssm_ref.dtype),
            mask=pn_mask & writes,
        )


@functools.partial(
    jax.jit,
    static_argnames=(
        "dt_softplus",
        "dt_limit",
        "interpret",
        "block_p",
        "block_c",
        "num_warps",
        "num_stages",
    ),
)
def mamba2_decode(
    zxbcdt: jax.Array,
    conv_weight: jax.Array,
    conv_bias: jax.Array | None,
    conv_state: jax.Array,
    ssm_state: jax.Array,
    A: jax.Array,
    read_slots: jax.Array,
    write_slots: jax.Array,
    *,
    D: jax.Array | None = None,
    dt_bias: jax.Array | None = None,
    dt_softplus: bool = True,
    dt_limit: tuple[float, float] = (0.0, float("inf")),
    interpret: bool = False,
    block_p: int = 32,
    block_c: int = 256,
    num_warps: int = 4,
    num_stages: int = 1,
) -> tuple[jax.Array, jax.Array, jax.Array]:
    """Pallas kernels for `mamba2_decode_reference` (same arguments and results).

    Both pools are aliased to the returned ones (donate them under jit to update in place).
    `block_p` tiles the head dim in the state-update launch, `block_c` the xBC channels in the
    conv launch (both rounded to powers of two, masked at the edges).
    """
    geo = check_decode_args(
        zxbcdt,
        conv_weight,
        conv_bias,
        conv_state,
        ssm_state,
        A,
        read_slots,
        write_slots,
        D,
        dt_bias,
    )
    read, write = read_slots.astype(jnp.int32), write_slots.astype(jnp.int32)
    zeros = jnp.zeros((geo.heads,), jnp.float32)
    bias = jnp.zeros((geo.conv_dim,), jnp.float32) if conv_bias is None else conv_bias
    params = plgpu.CompilerParams(num_warps=num_warps, num_stages=num_stages)
    block_c = min(pow2(block_c), pow2(geo.conv_dim))
    xbc_shape = (geo.batch, geo.lanes, geo.conv_dim)
    xbc, conv_state = pl.pallas_call(
        functools.partial(_conv_kernel, geo=geo, block_c=block_c, on_gpu=not interpret),
        out_shape=(sds_like(zxbcdt, xbc_shape), sds_like(conv_state)),
        grid=(pl.cdiv(geo.conv_dim, block_c), geo.batch),
        input_output_aliases={5: 1},
        compiler_params=params,
        interpret=interpret,
        name="mamba2_decode_conv",
    )(read, write, zxbcdt, conv_weight, bias, conv_state)
    block_p = min(pow2(block_p), pow2(geo.head_dim))
    y_shape = (geo.batch, geo.lanes, geo.heads, geo.head_dim)
    low, high = dt_limit  # a tuple, also where a caller passed a list
    kernel = functools.partial(
        _ssm_kernel,
        geo=geo,
        block_p=block_p,
        dt_softplus=dt_softplus,
        dt_limit=(low, high),
        on_gpu=not interpret,
    )
    y, ssm_state = pl.pallas_call(
        kernel,
        out_shape=(sds_like(zxbcdt, y_shape), sds_like(ssm_state)),
        grid=(pl.cdiv(geo.head_dim, block_p), geo.heads, geo.batch),
        input_output_aliases={7: 1},
        compiler_params=params,
        interpret=interpret,
        name="mamba2_decode_ssm",
    )(
        read,
        write,
        zxbcdt,
        xbc,
        A,
        zeros if D is None else D,
        zeros if dt_bias is None else dt_bias,
        ssm_state,
    )
    return y, conv_state, ssm_state
