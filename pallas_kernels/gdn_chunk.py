"""Gated DeltaNet chunked prefill (varlen, slots in-kernel), Pallas/Triton, two kernels.

1. `_intra_kernel`, grid (chunks, HV), all chunks in parallel: l2norm(k), in-chunk cumulative log
   decay G, A = strict-lower(beta_i (k_i . k_j) exp(G_i - G_j)), T = (I + A)^-1 (blocked: 16x16
   diagonal blocks by doubling products, then the block merge, all as dots), and the WY factors
   W = T (beta exp(G) k), U = T (beta v), stored per chunk tile.
2. `_chain_kernel`, grid (R + 1, HV, V tiles): sequential over the chunks of one row with the
   state slice [BV, K] in registers: v_new = U - W S^T, o = (exp(G) q) S^T + (q k^T o decay) v_new,
   S = exp(G_last) S + v_new^T (exp(G_last - G) k). Reads the initial state from its slot, writes
   block-boundary states and the final state to theirs. Program R zeroes the padding tokens.
Chunks are aligned to absolute positions (num_computed), so results do not depend on chunking.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plgpu

from pallas_kernels._common import pow2
from pallas_kernels.gdn_reference import (
    L2_EPS,
    check_prefill_args,
    chunk_table,
    gdn_chunk_reference,
    gdn_chunk_reference_chunked,
)

__all__ = ["gdn_chunk", "gdn_chunk_reference", "gdn_chunk_reference_chunked"]

_NT = (((1,), (1,)), ((), ()))  # a @ b.T
_TN = (((0,), (0,)), ((), ()))  # a.T @ b


def _dot(a, b, prec, dims=None):
    dims = (((1,), (0,)), ((), ())) if dims is None else dims
    return jax.lax.dot_general(a, b, dims, precision=prec, preferred_element_type=jnp.float32)


def _l2n_rows(x: jax.Array) -> jax.Array:
    return x * jax.lax.rsqrt(jnp.sum(x * x, axis=1) + L2_EPS)[:, None]


def _unit_lower_inverse(A: jax.Array, blk: int, prec) -> jax.Array:
    """(I + A)^-1 for strictly lower-triangular A [C, C], with dots only.

    Diagonal blocks of size blk: (I + X)^-1 = (I - X)(I + X^2)(I + X^4)... (X^blk = 0). Then with D
    the block-diagonal inverse and N = D A_off (strictly block-lower, N^(C/blk) = 0),
    (I + A)^-1 = (I + N)^-1 D, the same doubling product over the blocks.
    """
    C = A.shape[0]
    ii, jj = jnp.arange(C)[:, None], jnp.arange(C)[None, :]
    eye = jnp.where(ii == jj, 1.0, 0.0).astype(jnp.float32)
    same = (ii // blk) == (jj // blk)

    def neumann(X, n):  # sum_{m < n} (-X)^m for nilpotent X with X^n = 0, n a power of two
        P = -X
        acc = eye + P
        m = 2
        while m < n:
            P = _dot(P, P, prec)
            acc = _dot(acc, eye + P, prec)
            m *= 2
        return acc

    D = neumann(jnp.where(same, A, 0.0), blk)
    if blk >= C:
        return D
    N = _dot(D, jnp.where(same, 0.0, A), prec)
    return _dot(neumann(N, C // blk), D, prec)


def _intra_kernel(
    cstart_ref,
    clen_ref,
    k_ref,
    v_ref,
    g_ref,
    b_ref,
    w_ref,
    u_ref,
    *,
    rep,
    C,
    K,
    V,
    BK,
    BV,
    blk,
    l2,
    prec,
):
    c, hv = pl.program_id(0), pl.program_id(1)
    st, n = cstart_ref[c], clen_ref[c]
    rows = jnp.arange(C)
    rmask = rows < n
    kmask, vmask = jnp.arange(BK) < K, jnp.arange(BV) < V
    k = plgpu.load(
        k_ref.at[pl.ds(st, C), hv // rep, pl.ds(0, BK)],
        mask=rmask[:, None] & kmask[None, :],
        other=0.0,
    ).astype(jnp.float32)
    if l2:
        k = _l2n_rows(k)
    v = plgpu.load(
        v_ref.at[pl.ds(st, C), hv, pl.ds(0, BV)], mask=rmask[:, None] & vmask[None, :], other=0.0
    ).astype(jnp.float32)
    g = plgpu.load(g_ref.at[pl.ds(st, C), hv], mask=rmask, other=0.0).astype(jnp.float32)
    beta = plgpu.load(b_ref.at[pl.ds(st, C), hv], mask=rmask, other=0.0).astype(jnp.float32)
    G = jnp.cumsum(g)
    ii, jj = rows[:, None], rows[None, :]
    dec = jnp.exp(jnp.where(ii > jj, G[:, None] - G[None, :], 0.0))
    A = jnp.where(ii > jj, beta[:, None] * _dot(k, k, prec, _NT) * dec, 0.0)
    Tinv = _unit_lower_inverse(A, blk, prec)
    W = _dot(Tinv, (beta * jnp.exp(G))[:, None] * k, prec)
    U = _dot(Tinv, beta[:, None] * v, prec)
    plgpu.store(
        w_ref.at[c, hv, pl.ds(0, C), pl.ds(0, BK)], W.astype(w_ref.dtype), mask=kmask[None, :]
    )
    plgpu.store(
        u_ref.at[c, hv, pl.ds(0, C), pl.ds(0, BV)], U.astype(u_ref.dtype), mask=vmask[None, :]
    )


def _chain_kernel(
    qsl_ref,
    nc_ref,
    hi_ref,
    rs_ref,
    ws_ref,
    c0_ref,
    cnt_ref,
    bsl_ref,
    q_ref,
    k_ref,
    g_ref,
    w_ref,
    u_ref,
    _s_in,
    o_ref,
    s_ref,
    *,
    R,
    T,
    rep,
    C,
    K,
    V,
    BK,
    BV,
    scale,
    l2,
    bs,
    NB,
    prec,
):
    r, hv, vt = pl.program_id(0), pl.program_id(1), pl.program_id(2)
    rows = jnp.arange(C)
    kmask = jnp.arange(BK) < K
    vcol = vt * BV + jnp.arange(BV)
    vmask = vcol < V
    smask = vmask[:, None] & kmask[None, :]
    ii, jj = rows[:, None], rows[None, :]

    @pl.when(r == R)
    def _zero_padding():  # tokens at or past query_start_loc[R] get output 0
        p0 = qsl_ref[R]

        def body(j, carry):
            st = p0 + j * C
            m = ((st + rows) < T)[:, None] & vmask[None, :]
            plgpu.store(
                o_ref.at[pl.ds(st, C), hv, pl.ds(vt * BV, BV)],
                jnp.zeros((C, BV), o_ref.dtype),
                mask=m,
            )
            return carry

        jax.lax.fori_loop(0, (T - p0 + C - 1) // C, body, jnp.int32(0))

    @pl.when(r < R)
    def _row():
        q0, q1, nc = qsl_ref[r], qsl_ref[r + 1], nc_ref[r]
        rs, ws, c0 = rs_ref[r], ws_ref[r], c0_ref[r]
        srow = pl.ds(vt * BV, BV)
        s = plgpu.load(
            s_ref.at[jnp.maximum(rs, 0), hv, srow, pl.ds(0, BK)],
            mask=smask & (rs > 0) & (hi_ref[r] != 0),
            other=0.0,
        ).astype(jnp.float32)
        base = q0 - nc % C  # token index of the first chunk's absolute chunk start

        def chunk(j, s):
            tok0 = base + j * C
            st = jnp.maximum(tok0, q0)
            n = jnp.minimum(tok0 + C, q1) - st
            rmask = rows < n
            qk_mask = rmask[:, None] & kmask[None, :]
            q = plgpu.load(
                q_ref.at[pl.ds(st, C), hv // rep, pl.ds(0, BK)], mask=qk_mask, other=0.0
            ).astype(jnp.float32)
            k = plgpu.load(
                k_ref.at[pl.ds(st, C), hv // rep, pl.ds(0, BK)], mask=qk_mask, other=0.0
            ).astype(jnp.float32)
            if l2:
                q, k = _l2n_rows(q), _l2n_rows(k)
            q = q * scale
            g = plgpu.load(g_ref.at[pl.ds(st, C), hv], mask=rmask, other=0.0).astype(jnp.float32)
            G = jnp.cumsum(g)
            g_last = jnp.sum(g)
            w = plgpu.load(w_ref.at[c0 + j, hv, pl.ds(0, C), pl.ds(0, BK)]).astype(jnp.float32)
            u = plgpu.load(u_ref.at[c0 + j, hv, pl.ds(0, C), srow]).astype(jnp.float32)
            v_new = u - _dot(w, s, prec, _NT)  # [C, BV]
            dec = jnp.where(
                ii >= jj, jnp.exp(jnp.where(ii >= jj, G[:, None] - G[None, :], 0.0)), 0.0
            )
            qk = _dot(q, k, prec, _NT) * dec
            o = _dot(q * jnp.exp(G)[:, None], s, prec, _NT) + _dot(qk, v_new, prec)
            plgpu.store(
                o_ref.at[pl.ds(st, C), hv, srow],
                o.astype(o_ref.dtype),
                mask=rmask[:, None] & vmask[None, :],
            )
            kd = jnp.exp(g_last - G)[:, None] * k
            s = jnp.exp(g_last) * s + _dot(v_new, kd, prec, _TN)  # [BV, BK]
            if NB:
                p1 = nc - nc % C + (j + 1) * C  # absolute position just past this chunk
                jb = p1 // bs - nc // bs - 1
                slot = bsl_ref[r, jnp.clip(jb, 0, NB - 1)]
                hit = (p1 % bs == 0) & (tok0 + C <= q1) & (jb < NB) & (slot > 0)
                plgpu.store(
                    s_ref.at[jnp.maximum(slot, 0), hv, srow, pl.ds(0, BK)],
                    s.astype(s_ref.dtype),
                    mask=smask & hit,
                )
            return s

        s = jax.lax.fori_loop(0, cnt_ref[r], chunk, s)
        plgpu.store(
            s_ref.at[jnp.maximum(ws, 0), hv, srow, pl.ds(0, BK)],
            s.astype(s_ref.dtype),
            mask=smask & (ws > 0),
        )


def _intra_call(k, v, g, beta, cstart, clen, *, HV, C, blk, l2, prec, inter, num_warps, interpret):
    """WY factors W [NC, HV, C, BK] and U [NC, HV, C, BV] of every chunk tile (kernel 1)."""
    HK, K = k.shape[1], k.shape[2]
    V = v.shape[2]
    BK, BVf = pow2(K), pow2(V)
    NCH = cstart.shape[0]
    kern = functools.partial(
        _intra_kernel, rep=HV // HK, C=C, K=K, V=V, BK=BK, BV=BVf, blk=blk, l2=l2, prec=prec
    )
    mat = functools.partial(jax.ShapeDtypeStruct, dtype=inter)
    return pl.pallas_call(
        kern,
        out_shape=(mat((NCH, HV, C, BK)), mat((NCH, HV, C, BVf))),
        grid=(NCH, HV),
        compiler_params=plgpu.CompilerParams(num_warps=num_warps, num_stages=1),
        interpret=interpret,
        name="gdn_chunk_intra",
    )(cstart, clen, k, v, g, beta)


def chunk_tiles(query_start_loc, num_computed, T: int, C: int):
    """Per chunk tile: first token and token count (int32 [NC]); per row: chunk count and first
    tile index (int32 [R]). Chunks are aligned to absolute positions."""
    i32 = jnp.int32
    qsl, nc = query_start_loc.astype(i32), num_computed.astype(i32)
    R = nc.shape[0]
    row, tok0, _, _, _ = chunk_table(qsl, nc, T, C)
    rowc = jnp.minimum(row, R - 1)
    cstart = jnp.maximum(tok0, qsl[rowc])
    clen = jnp.where(row < R, jnp.minimum(tok0 + C, qsl[rowc + 1]) - cstart, 0).astype(i32)
    length = qsl[1:] - qsl[:-1]
    count = jnp.where(length > 0, (nc % C + length + C - 1) // C, 0).astype(i32)
    c0 = (jnp.cumsum(count) - count).astype(i32)
    return cstart.astype(i32), clen, count, c0


def gdn_chunk(
    q,
    k,
    v,
    g,
    beta,
    state,
    query_start_loc,
    num_computed,
    has_initial_state,
    read_slots,
    write_slots,
    *,
    scale: float | None = None,
    use_qk_l2norm: bool = True,
    chunk_size: int = 64,
    block_size: int | None = None,
    boundary_slots=None,
    interpret: bool = False,
    block_v: int = 32,
    solve_block: int = 16,
    inter_dtype=None,
    num_warps: int = 4,
    num_stages: int = 2,
    intra_num_warps: int = 4,
    precision=None,
    intra_precision=None,
):
    """Pallas Gated DeltaNet prefill; same contract as `gdn_chunk_reference`.

    q, k [T, HK, K]; v [T, HV, V]; g, beta [T, HV]; state [S, HV, V, K] (updated in place);
    query_start_loc [R + 1]; num_computed, has_initial_state, read_slots, write_slots [R].
    Tuning: block_v (V rows per chain program), solve_block (diagonal block of the triangular
    inverse), inter_dtype (storage of the WY factors; default v.dtype), warps/stages, precision
    of the in-kernel dots on GPU (None = TF32; intra_precision for the first kernel; interpret
    mode always uses HIGHEST).
    """
    check_prefill_args(
        q,
        k,
        v,
        g,
        beta,
        state,
        query_start_loc,
        num_computed,
        has_initial_state,
        read_slots,
        write_slots,
        chunk_size,
        block_size,
        boundary_slots,
    )
    T, HK, K = q.shape
    HV, V = v.shape[1], v.shape[2]
    R, C = num_computed.shape[0], chunk_size
    i32 = jnp.int32
    qsl, nc = query_start_loc.astype(i32), num_computed.astype(i32)
    cstart, clen, count, c0 = chunk_tiles(qsl, nc, T, C)
    BK, BVf = pow2(K), pow2(V)
    prec = jax.lax.Precision.HIGHEST if interpret else precision
    blk = min(solve_block, C)
    inter = v.dtype if inter_dtype is None else inter_dtype
    w, u = _intra_call(
        k,
        v,
        g,
        beta,
        cstart,
        clen,
        HV=HV,
        C=C,
        blk=blk,
        l2=use_qk_l2norm,
        prec=prec if intra_precision is None else intra_precision,
        inter=inter,
        num_warps=intra_num_warps,
        interpret=interpret,
    )
    NB = 0 if boundary_slots is None else boundary_slots.shape[1]
    bsl = jnp.zeros((R, 1), i32) if NB == 0 else boundary_slots.astype(i32)
    BV = min(pow2(block_v), BVf)
    o, state = pl.pallas_call(
        functools.partial(
            _chain_kernel,
            R=R,
            T=T,
            rep=HV // HK,
            C=C,
            K=K,
            V=V,
            BK=BK,
            BV=BV,
            scale=float(K**-0.5 if scale is None else scale),
            l2=use_qk_l2norm,
            bs=block_size or C,
            NB=NB,
            prec=prec,
        ),
        out_shape=(
            jax.ShapeDtypeStruct((T, HV, V), v.dtype),
            jax.ShapeDtypeStruct(state.shape, state.dtype),
        ),
        grid=(R + 1, HV, pl.cdiv(V, BV)),
        input_output_aliases={13: 1},
        compiler_params=plgpu.CompilerParams(num_warps=num_warps, num_stages=num_stages),
        interpret=interpret,
        name="gdn_chunk_chain",
    )(
        qsl,
        nc,
        has_initial_state.astype(i32),
        read_slots.astype(i32),
        write_slots.astype(i32),
        c0,
        count,
        bsl,
        q,
        k,
        g,
        w,
        u,
        state,
    )
    return o, state
