"""Gated DeltaNet decode, fused: causal conv update of qkv + l2norm + gating + the delta-rule state
update, reading in_proj's output.

Glossary: B decode rows, L = 1 + K lanes, HK key heads, HV value heads, K / V key / value head
dims, W conv width, S slots; key_dim = HK K, value_dim = HV V, conv_dim = 2 key_dim + value_dim.

    mixed       [B, L, conv_dim + value_dim + 2 HV]   in_proj's output: [qkv | z | b | a]
    conv_weight [conv_dim, W], conv_bias [conv_dim] or None, conv_state [S, conv_dim, W - 1]
    state       [S, HV, V, K] (fp32, V-first), A_log / dt_bias [HV]
    -> o [B, L, HV, V] (mixed's dtype; before the gated norm, z is not read), conv_state, state

The result is `gdn_decode_reference` (`gdn/reference.py`): `causal_conv1d_update(qkv,
activation="silu")` followed by `gdn_state_update` on the split q / k / v (l2norm,
beta = sigmoid(b), g = -exp(A_log) softplus(a + dt_bias)). The conv output is rounded to mixed's
dtype, as the unfused path materialises it. Slots as in the other decode ops
(not live: <= 0 or >= S reads zeros, writes nothing, its lanes output 0).

Two launches, reading `mixed` by column offset, for the reason given in `ssd/decode.py`: the q / k
columns are shared by the HV / HK value heads of a key head, and a one-token decode rewrites its
read slot in place, so their windows are convolved (and written) once per row by launch 1
(`_qk_conv_kernel`, grid (2 key_dim / block_c, B)); launch 2 (`_delta_kernel`, grid
(V / block_v, HV, B)) convolves the tile's v columns and runs the state update (a row's tiles
first: `pallas_kernels/_common.py`, "Decode launch order").
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plgpu

from pallas_kernels._common import (
    conv_update_lanes,
    live_slot,
    loads_before_stores,
    pow2,
    safe_slot,
    sds_like,
)
from pallas_kernels.gdn.reference import L2_EPS, Geometry, check_decode_args


def _qk_conv_kernel(
    read_ref,
    write_ref,
    mixed_ref,
    w_ref,
    bias_ref,
    conv_in_ref,
    qk_ref,
    conv_ref,
    *,
    geo: Geometry,
    block_c: int,
    on_gpu: bool,
):
    """One (row, block of q/k channels): their conv; windows and qk [B, L, 2 key_dim] out."""
    del conv_in_ref  # aliased to conv_ref
    start, b = pl.program_id(0) * block_c, pl.program_id(1)
    block = pl.ds(start, block_c)  # q and k are the first channels and the first columns
    mask = start + jnp.arange(block_c) < 2 * geo.key_dim
    outs = conv_update_lanes(
        read_ref,
        write_ref,
        mixed_ref,
        w_ref,
        bias_ref,
        conv_ref,
        row=b,
        channel=block,
        column=block,
        mask=mask,
        lanes=geo.lanes,
        width=geo.width,
        on_gpu=on_gpu,
        dtype=qk_ref.dtype,
    )
    for t, out in enumerate(outs):
        plgpu.store(qk_ref.at[b, jnp.int32(t), block], out.astype(qk_ref.dtype), mask=mask)


def _l2n(x: jax.Array) -> jax.Array:
    return x * jax.lax.rsqrt(jnp.sum(x * x) + L2_EPS)


def _delta_kernel(
    read_ref,
    write_ref,
    mixed_ref,
    qk_ref,
    w_ref,
    bias_ref,
    alog_ref,
    dt_bias_ref,
    conv_in_ref,
    state_in_ref,
    o_ref,
    conv_ref,
    state_ref,
    *,
    geo: Geometry,
    block_v: int,
    scale: float,
    l2: bool,
    on_gpu: bool,
):
    """One (row, value head, V tile): conv of the tile's v columns, then the gated delta rule with
    the [block_v, K] state tile in registers across the row's lanes."""
    del conv_in_ref, state_in_ref  # aliased to conv_ref, state_ref
    vt, hv, b = pl.program_id(0), pl.program_id(1), pl.program_id(2)
    hk = hv // (geo.v_heads // geo.k_heads)
    block_k = pow2(geo.k_dim)
    v0 = vt * block_v
    v_mask = v0 + jnp.arange(block_v) < geo.v_dim
    k_mask = jnp.arange(block_k) < geo.k_dim
    vk_mask = v_mask[:, None] & k_mask[None, :]
    c0 = 2 * geo.key_dim + hv * geo.v_dim + v0  # first v channel (and column) of the tile
    vs = conv_update_lanes(
        read_ref,
        write_ref,
        mixed_ref,
        w_ref,
        bias_ref,
        conv_ref,
        row=b,
        channel=pl.ds(c0, block_v),
        column=pl.ds(c0, block_v),
        mask=v_mask,
        lanes=geo.lanes,
        width=geo.width,
        dtype=o_ref.dtype,
        on_gpu=on_gpu,
    )
    read, num_slots = read_ref[b], state_ref.shape[0]
    v_sl, k_sl = pl.ds(v0, block_v), pl.ds(0, block_k)
    s = plgpu.load(
        state_ref.at[safe_slot(read, num_slots), hv, v_sl, k_sl],
        mask=vk_mask & live_slot(read, num_slots),
        other=0.0,
    ).astype(jnp.float32)
    loads_before_stores(on_gpu)
    neg_a = -jnp.exp(alog_ref[hv].astype(jnp.float32))
    dt_bias = dt_bias_ref[hv].astype(jnp.float32)
    b_col = geo.conv_dim + geo.value_dim + hv
    q_sl = pl.ds(hk * geo.k_dim, block_k)
    k_sl_qk = pl.ds(geo.key_dim + hk * geo.k_dim, block_k)
    for t, v in enumerate(vs):
        tt = jnp.int32(t)
        q = plgpu.load(qk_ref.at[b, tt, q_sl], mask=k_mask, other=0.0).astype(jnp.float32)
        k = plgpu.load(qk_ref.at[b, tt, k_sl_qk], mask=k_mask, other=0.0).astype(jnp.float32)
        if l2:
            q, k = _l2n(q), _l2n(k)
        q = q * scale
        a = mixed_ref[b, tt, b_col + geo.v_heads].astype(jnp.float32)
        g = neg_a * jax.nn.softplus(a + dt_bias)
        beta = jax.nn.sigmoid(mixed_ref[b, tt, b_col].astype(jnp.float32))
        s = s * jnp.exp(g)
        delta = beta * (v - jnp.sum(s * k[None, :], axis=1))
        s = s + delta[:, None] * k[None, :]
        o = jnp.sum(s * q[None, :], axis=1)
        write = write_ref[b, tt]
        writes = live_slot(write, num_slots)
        plgpu.store(
            o_ref.at[b, tt, hv, v_sl], jnp.where(writes, o, 0.0).astype(o_ref.dtype), mask=v_mask
        )
        plgpu.store(
            state_ref.at[safe_slot(write, num_slots), hv, v_sl, k_sl],
            s.astype(state_ref.dtype),
            mask=vk_mask & writes,
        )


@functools.partial(
    jax.jit,
    static_argnames=(
        "scale",
        "use_qk_l2norm",
        "interpret",
        "block_v",
        "block_c",
        "num_warps",
        "num_stages",
    ),
)
def gdn_decode(
    mixed: jax.Array,
    conv_weight: jax.Array,
    conv_bias: jax.Array | None,
    conv_state: jax.Array,
    state: jax.Array,
    A_log: jax.Array,
    dt_bias: jax.Array,
    read_slots: jax.Array,
    write_slots: jax.Array,
    *,
    scale: float | None = None,
    use_qk_l2norm: bool = True,
    interpret: bool = False,
    block_v: int = 32,
    block_c: int = 256,
    num_warps: int = 4,
    num_stages: int = 1,
) -> tuple[jax.Array, jax.Array, jax.Array]:
    """Pallas kernels for `gdn_decode_reference` (same arguments and results).

    Both pools are aliased to the returned ones (donate them under jit to update in place).
    `block_v` tiles V in the state-update launch, `block_c` the q/k channels in the conv launch
    (both rounded to powers of two, masked at the edges).
    """
    geo = check_decode_args(
        mixed, conv_weight, conv_bias, conv_state, state, A_log, dt_bias, read_slots, write_slots
    )
    read, write = read_slots.astype(jnp.int32), write_slots.astype(jnp.int32)
    bias = jnp.zeros((geo.conv_dim,), jnp.float32) if conv_bias is None else conv_bias
    params = plgpu.CompilerParams(num_warps=num_warps, num_stages=num_stages)
    block_c = min(pow2(block_c), pow2(2 * geo.key_dim))
    qk, conv_state = pl.pallas_call(
        functools.partial(_qk_conv_kernel, geo=geo, block_c=block_c, on_gpu=not interpret),
        out_shape=(sds_like(mixed, (geo.batch, geo.lanes, 2 * geo.key_dim)), sds_like(conv_state)),
        grid=(pl.cdiv(2 * geo.key_dim, block_c), geo.batch),
        input_output_aliases={5: 1},
        compiler_params=params,
        interpret=interpret,
        name="gdn_decode_qk_conv",
    )(read, write, mixed, conv_weight, bias, conv_state)
    block_v = min(pow2(block_v), pow2(geo.v_dim))
    kernel = functools.partial(
        _delta_kernel,
        geo=geo,
        block_v=block_v,
        scale=float(geo.k_dim**-0.5 if scale is None else scale),
        l2=use_qk_l2norm,
        on_gpu=not interpret,
    )
    o_shape = (geo.batch, geo.lanes, geo.v_heads, geo.v_dim)
    return pl.pallas_call(
        kernel,
        out_shape=(sds_like(mixed, o_shape), sds_like(conv_state), sds_like(state)),
        grid=(pl.cdiv(geo.v_dim, block_v), geo.v_heads, geo.batch),
        input_output_aliases={8: 1, 9: 2},
        compiler_params=params,
        interpret=interpret,
        name="gdn_decode_delta",
    )(read, write, mixed, qk, conv_weight, bias, A_log, dt_bias, conv_state, state)
