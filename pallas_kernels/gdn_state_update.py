"""Gated DeltaNet decode with fused gating and l2norm (rows of L = 1 + K tokens), Pallas/Triton.

One program per (row b, value head hv, V tile): the [BV, K] slice of state[read_slots[b], hv]
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
from pallas_kernels.gdn_reference import L2_EPS, gdn_state_update_reference

__all__ = ["gdn_state_update", "gdn_state_update_reference"]


def _l2n(x: jax.Array) -> jax.Array:
    return x * jax.lax.rsqrt(jnp.sum(x * x) + L2_EPS)


def _kernel(
    rs_ref,
    ws_ref,
    q_ref,
    k_ref,
    v_ref,
    a_ref,
    b_ref,
    alog_ref,
    dtb_ref,
    _s_in,
    o_ref,
    s_ref,
    *,
    L,
    rep,
    K,
    V,
    BK,
    BV,
    scale,
    l2,
    on_gpu,
):
    b, hv, vt = pl.program_id(0), pl.program_id(1), pl.program_id(2)
    hk = hv // rep
    kcol = jnp.arange(BK)
    vrow = vt * BV + jnp.arange(BV)
    kmask, vmask = kcol < K, vrow < V
    smask = vmask[:, None] & kmask[None, :]
    rs, num_slots = rs_ref[b], s_ref.shape[0]
    # Masked load: the NULL slot (possibly NaN) and out-of-range slots are never read.
    s = plgpu.load(
        s_ref.at[safe_slot(rs, num_slots), hv, pl.ds(vt * BV, BV), pl.ds(0, BK)],
        mask=smask & live_slot(rs, num_slots),
        other=0.0,
    ).astype(jnp.float32)
    loads_before_stores(on_gpu)  # lane 0 may write the slot it read (in place)
    neg_a = -jnp.exp(alog_ref[hv].astype(jnp.float32))
    dtb = dtb_ref[hv].astype(jnp.float32)
    for t in range(L):  # L is small and static: unrolled
        ti = jnp.int32(t)
        q = plgpu.load(q_ref.at[b, ti, hk, pl.ds(0, BK)], mask=kmask, other=0.0).astype(jnp.float32)
        k = plgpu.load(k_ref.at[b, ti, hk, pl.ds(0, BK)], mask=kmask, other=0.0).astype(jnp.float32)
        v = plgpu.load(v_ref.at[b, ti, hv, pl.ds(vt * BV, BV)], mask=vmask, other=0.0)
        if l2:
            q, k = _l2n(q), _l2n(k)
        q = q * scale
        g = neg_a * jax.nn.softplus(a_ref[b, ti, hv].astype(jnp.float32) + dtb)
        beta = jax.nn.sigmoid(b_ref[b, ti, hv].astype(jnp.float32))
        s = s * jnp.exp(g)
        delta = beta * (v.astype(jnp.float32) - jnp.sum(s * k[None, :], axis=1))
        s = s + delta[:, None] * k[None, :]
        o = jnp.sum(s * q[None, :], axis=1)
        ws = ws_ref[b, ti]
        live = live_slot(ws, num_slots)
        o = jnp.where(live, o, 0.0)
        plgpu.store(o_ref.at[b, ti, hv, pl.ds(vt * BV, BV)], o.astype(o_ref.dtype), mask=vmask)
        plgpu.store(
            s_ref.at[safe_slot(ws, num_slots), hv, pl.ds(vt * BV, BV), pl.ds(0, BK)],
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
    """Pallas Gated DeltaNet decode; same contract as `gdn_state_update_reference`.

    q, k [B, L, HK, K]; v [B, L, HV, V]; a, b [B, L, HV]; A_log, dt_bias [HV]; state [S, HV, V, K]
    (updated in place via input_output_aliases); read_slots [B]; write_slots [B, L].
    Tuning: block_v (V rows per program), num_warps, num_stages.
    """
    Bn, L, HK, K = q.shape
    HV, V = v.shape[2], v.shape[3]
    # Shape checks are shared with the reference (it raises ValueError naming the argument).
    jax.eval_shape(
        functools.partial(gdn_state_update_reference, scale=scale, use_qk_l2norm=use_qk_l2norm),
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
    )
    BK, BV = pow2(K), min(pow2(block_v), pow2(V))
    kern = functools.partial(
        _kernel,
        L=L,
        rep=HV // HK,
        K=K,
        V=V,
        BK=BK,
        BV=BV,
        scale=float(K**-0.5 if scale is None else scale),
        l2=use_qk_l2norm,
        on_gpu=not interpret,
    )
    o, state = pl.pallas_call(
        kern,
        out_shape=(
            jax.ShapeDtypeStruct(
                (Bn, L, HV, V), v.dtype, manual_axis_type=jax.typeof(v).manual_axis_type
            ),
            sds_like(state),
        ),
        grid=(Bn, HV, pl.cdiv(V, BV)),
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
    return o, state
