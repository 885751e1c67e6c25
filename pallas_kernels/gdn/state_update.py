"""Gated DeltaNet decode with fused gating and l2norm (rows of L = 1 + K tokens), Pallas/Triton.

One program per (V tile, value head hv, row b), in that launch order (`_common.py`,
"Decode launch order"): the [BV, K] slice of state[read_slots[b], hv]
(V-first, rows contiguous in memory) stays in registers across the L lanes; after lane t it is
stored to write_slots[b, t] when live. A slot that is not live (<= 0 or >= S) reads zeros / writes
nothing; dead lanes output 0.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plgpu

from pallas_kernels._common import live_slot, loads_before_stores, pow2, safe_slot, sds_like
from pallas_kernels.gdn.reference import L2_EPS, check_update_args


def _l2n(x: jax.Array) -> jax.Array:
    return x * jax.lax.rsqrt(jnp.sum(x * x) + L2_EPS)


def _kernel(
    read_ref,
    write_ref,
    q_ref,
    k_ref,
    v_ref,
    a_ref,
    b_ref,
    alog_ref,
    dtb_ref,
    state_in_ref,
    o_ref,
    s_ref,
    *,
    lanes,
    heads_per_key,
    k_dim,
    v_dim,
    block_k,
    block_v,
    scale,
    l2norm,
    on_gpu,
):
    """Program (row, value head, V tile): the [block_v, K] state tile in registers across the
    row's lanes."""
    del state_in_ref  # aliased to s_ref
    vt, hv, b = pl.program_id(0), pl.program_id(1), pl.program_id(2)
    hk = hv // heads_per_key
    kcol = jnp.arange(block_k)
    vrow = vt * block_v + jnp.arange(block_v)
    kmask, vmask = kcol < k_dim, vrow < v_dim
    v_sl, k_sl = pl.ds(vt * block_v, block_v), pl.ds(0, block_k)
    smask = vmask[:, None] & kmask[None, :]
    read, num_slots = read_ref[b], s_ref.shape[0]
    # Masked load: the NULL slot (possibly NaN) and out-of-range slots are never read.
    s = plgpu.load(
        s_ref.at[safe_slot(read, num_slots), hv, v_sl, k_sl],
        mask=smask & live_slot(read, num_slots),
        other=0.0,
    ).astype(jnp.float32)
    loads_before_stores(on_gpu)  # lane 0 may write the slot it read (in place)
    neg_a = -jnp.exp(alog_ref[hv].astype(jnp.float32))
    dtb = dtb_ref[hv].astype(jnp.float32)
    for t in range(lanes):  # few and static: unrolled
        ti = jnp.int32(t)
        q = plgpu.load(q_ref.at[b, ti, hk, k_sl], mask=kmask, other=0.0).astype(jnp.float32)
        k = plgpu.load(k_ref.at[b, ti, hk, k_sl], mask=kmask, other=0.0).astype(jnp.float32)
        v = plgpu.load(v_ref.at[b, ti, hv, v_sl], mask=vmask, other=0.0)
        if l2norm:
            q, k = _l2n(q), _l2n(k)
        q = q * scale
        g = neg_a * jax.nn.softplus(a_ref[b, ti, hv].astype(jnp.float32) + dtb)
        beta = jax.nn.sigmoid(b_ref[b, ti, hv].astype(jnp.float32))
        s = s * jnp.exp(g)
        delta = beta * (v.astype(jnp.float32) - jnp.sum(s * k[None, :], axis=1))
        s = s + delta[:, None] * k[None, :]
        o = jnp.sum(s * q[None, :], axis=1)
        write = write_ref[b, ti]
        live = live_slot(write, num_slots)
        o = jnp.where(live, o, 0.0)
        plgpu.store(o_ref.at[b, ti, hv, v_sl], o.astype(o_ref.dtype), mask=vmask)
        plgpu.store(
            s_ref.at[safe_slot(write, num_slots), hv, v_sl, k_sl],
            s.astype(s_ref.dtype),
            mask=smask & live,
        )


def gdn_state_update(
    q,
    k,
    v,
    a,
    b,
    A_log,
    dt_bias,
    state,
    read_slots,
    write_slots,
    *,
    scale: float | None = None,
    use_qk_l2norm: bool = True,
    interpret: bool = False,
    block_v: int = 32,
    num_warps: int = 4,
    num_stages: int = 1,
):
    """Pallas kernel for `gdn_state_update_reference` (same arguments and results).

    q, k [B, L, HK, K]; v [B, L, HV, V]; a, b [B, L, HV]; A_log, dt_bias [HV]; state [S, HV, V, K]
    (updated in place via input_output_aliases); read_slots [B]; write_slots [B, L].
    Tuning: block_v (V rows per program), num_warps, num_stages.
    """
    check_update_args(q, k, v, a, b, A_log, dt_bias, state, read_slots, write_slots)
    batch, lanes, k_heads, k_dim = q.shape
    v_heads, v_dim = v.shape[2], v.shape[3]
    block_v = min(pow2(block_v), pow2(v_dim))
    kernel = functools.partial(
        _kernel,
        lanes=lanes,
        heads_per_key=v_heads // k_heads,
        k_dim=k_dim,
        v_dim=v_dim,
        block_k=pow2(k_dim),
        block_v=block_v,
        scale=float(k_dim**-0.5 if scale is None else scale),
        l2norm=use_qk_l2norm,
        on_gpu=not interpret,
    )
    return pl.pallas_call(
        kernel,
        out_shape=(sds_like(v, (batch, lanes, v_heads, v_dim)), sds_like(state)),
        grid=(pl.cdiv(v_dim, block_v), v_heads, batch),
        input_output_aliases={9: 1},
        compiler_params=plgpu.CompilerParams(num_warps=num_warps, num_stages=num_stages),
        interpret=interpret,
        name="gdn_state_update",
    )(
        read_slots.astype(jnp.int32),
        write_slots.astype(jnp.int32),
        q,
        k,
        v,
        a,
        b,
        A_log,
        dt_bias,
        state,
    )
