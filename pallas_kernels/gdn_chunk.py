"""Gated DeltaNet chunked prefill (varlen, slots in-kernel), Pallas/Triton, two kernels.

1. `_intra_kernel`, grid (chunk tiles, HV), all chunks in parallel. Everything that does not depend
   on the state: l2norm(q, k), in-chunk cumulative log decay G, A = strict-lower(beta_i (k_i . k_j)
   exp(G_i - G_j)), T = (I + A)^-1 (blocked doubling products, all dots), the WY factors
   W = T (beta exp(G) k), U = T (beta v), and the tiles the chain needs as they are used there:
   KD = exp(G_last - G) k, QE = scale exp(G) q, AQK = scale (q k^T) o causal decay.
2. `_chain_kernel`, grid (R + 1, HV, V tiles): sequential over the chunks of one row with the
   transposed state slice S^T [K, BV] in fp32 registers. Per chunk only four small dots:
   v_new = U - W S^T, o = QE S^T + AQK v_new, S^T = exp(G_last) S^T + KD^T v_new. Reads the
   initial state from its slot, writes block-boundary states and the final state to theirs.
   Program R zeroes the padding tokens.
Dot operands are in `inter_dtype` (bf16 for bf16 inputs: tensor cores, fp32 accumulation); the
triangular inverse uses `solve_dtype` (default the same; fp32 = TF32 on GPU). Chunks are aligned to
absolute positions (num_computed), so results do not depend on chunking.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plgpu

from pallas_kernels._common import live_slot, pow2, safe_slot
from pallas_kernels.gdn_reference import (
    L2_EPS,
    check_prefill_args,
    chunk_table,
    gdn_chunk_reference,
    gdn_chunk_reference_chunked,
)

__all__ = ["gdn_chunk", "gdn_chunk_reference", "gdn_chunk_reference_chunked"]

_NN = (((1,), (0,)), ((), ()))  # a @ b
_NT = (((1,), (1,)), ((), ()))  # a @ b.T
_TN = (((0,), (0,)), ((), ()))  # a.T @ b


def _mm(a, b, dt, prec, dims=_NN):
    """a @ b (per dims) with operands cast to dt, fp32 accumulation; prec only for fp32 operands."""
    p = prec if dt == jnp.float32 else None
    return jax.lax.dot_general(
        a.astype(dt), b.astype(dt), dims, precision=p, preferred_element_type=jnp.float32
    )


def _l2n_rows(x: jax.Array) -> jax.Array:
    return x * jax.lax.rsqrt(jnp.sum(x * x, axis=1) + L2_EPS)[:, None]


def _unit_lower_inverse(A: jax.Array, blk: int, dt, prec, refine: bool) -> jax.Array:
    """(I + A)^-1 for strictly lower-triangular A [C, C], with dots only (operands in dt).

    Diagonal blocks of size blk: (I + X)^-1 = (I - X)(I + X^2)(I + X^4)... (X^blk = 0). Then with D
    the block-diagonal inverse and N = D A_off (strictly block-lower, N^(C/blk) = 0),
    (I + A)^-1 = (I + N)^-1 D, the same doubling product over the blocks. `refine`: one Newton
    step T <- 2T - T (I + A) T with fp32 (TF32) operands, for a low-precision dt.
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
            P = _mm(P, P, dt, prec)
            acc = _mm(acc, eye + P, dt, prec)
            m *= 2
        return acc

    D = neumann(jnp.where(same, A, 0.0), blk)
    Tinv = D
    if blk < C:
        N = _mm(D, jnp.where(same, 0.0, A), dt, prec)
        Tinv = _mm(neumann(N, C // blk), D, dt, prec)
    if refine:
        f32 = jnp.float32
        Tinv = 2.0 * Tinv - _mm(Tinv, _mm(eye + A, Tinv, f32, prec), f32, prec)
    return Tinv


@dataclasses.dataclass(frozen=True)
class _IntraSpec:
    """Static shapes and arithmetic of kernel 1.

    rep: value heads per key head; C: chunk; K, V: head dims; BK, BV: their power-of-two blocks;
    dt: tile storage and dot operands; sdt: operands of the inverse's dots; prec: precision of fp32
    dots; scale: q scale; l2: l2-normalise q and k; blk: diagonal block of the inverse; refine: one
    Newton step on the inverse.
    """

    rep: int
    C: int
    K: int
    V: int
    BK: int
    BV: int
    dt: jnp.dtype
    sdt: jnp.dtype
    prec: jax.lax.Precision | None
    scale: float
    l2: bool
    blk: int
    refine: bool


def _intra_kernel(
    cstart_ref, clen_ref, q_ref, k_ref, v_ref, g_ref, b_ref, *out_refs, spec: _IntraSpec,
    wy: bool, qk: bool,
):  # fmt: skip
    """Kernel 1 body: `wy` writes W, U; `qk` writes KD, QE, AQK (in that order). Tiles are computed
    and stored one after another so few stay live in registers.

    Every tile is stored whole, its padding columns (K..BK, V..BV: zeros, from masked loads)
    included, so no later reader can meet memory that nothing wrote.
    """
    C, K, V, BK, BV, dt, prec = spec.C, spec.K, spec.V, spec.BK, spec.BV, spec.dt, spec.prec
    c, hv = pl.program_id(0), pl.program_id(1)
    st, n = cstart_ref[c], clen_ref[c]
    rows = jnp.arange(C)
    rmask = rows < n
    kmask, vmask = jnp.arange(BK) < K, jnp.arange(BV) < V
    qk_at = (pl.ds(st, C), hv // spec.rep, pl.ds(0, BK))
    qk_mask = rmask[:, None] & kmask[None, :]
    outs = list(out_refs)

    def put(x):
        ref = outs.pop(0)
        plgpu.store(ref.at[c, hv, pl.ds(0, C), pl.ds(0, x.shape[1])], x.astype(ref.dtype))

    def load_qk(ref):
        x = plgpu.load(ref.at[qk_at], mask=qk_mask, other=0.0).astype(jnp.float32)
        return _l2n_rows(x) if spec.l2 else x

    k = load_qk(k_ref)
    g = plgpu.load(g_ref.at[pl.ds(st, C), hv], mask=rmask, other=0.0).astype(jnp.float32)
    G = jnp.cumsum(g)
    eG = jnp.exp(G)
    ii, jj = rows[:, None], rows[None, :]
    dec = jnp.where(ii >= jj, jnp.exp(jnp.where(ii >= jj, G[:, None] - G[None, :], 0.0)), 0.0)
    if wy:
        beta = plgpu.load(b_ref.at[pl.ds(st, C), hv], mask=rmask, other=0.0).astype(jnp.float32)
        A = jnp.where(ii > jj, beta[:, None] * _mm(k, k, dt, prec, _NT) * dec, 0.0)
        Tinv = _unit_lower_inverse(A, spec.blk, spec.sdt, prec, spec.refine)
        put(_mm(Tinv, (beta * eG)[:, None] * k, dt, prec))  # W
        v = plgpu.load(
            v_ref.at[pl.ds(st, C), hv, pl.ds(0, BV)],
            mask=rmask[:, None] & vmask[None, :],
            other=0.0,
        )
        put(_mm(Tinv, beta[:, None] * v.astype(jnp.float32), dt, prec))  # U
    if qk:
        put(jnp.exp(jnp.sum(g) - G)[:, None] * k)  # KD
        q = load_qk(q_ref)
        put((spec.scale * eG)[:, None] * q)  # QE
        put((spec.scale * _mm(q, k, dt, prec, _NT)) * dec)  # AQK


def _chain_kernel(
    qsl_ref,
    nc_ref,
    hi_ref,
    rs_ref,
    ws_ref,
    c0_ref,
    cnt_ref,
    bsl_ref,
    g_ref,
    w_ref,
    u_ref,
    kd_ref,
    qe_ref,
    aqk_ref,
    _s_in,
    o_ref,
    s_ref,
    *,
    R,
    T,
    C,
    K,
    V,
    BK,
    BV,
    bs,
    NB,
    prec,
    dt,
):
    r, hv, vt = pl.program_id(0), pl.program_id(1), pl.program_id(2)
    rows = jnp.arange(C)
    kmask = jnp.arange(BK) < K
    vmask = (vt * BV + jnp.arange(BV)) < V
    smask = vmask[:, None] & kmask[None, :]
    srow = pl.ds(vt * BV, BV)
    num_slots = s_ref.shape[0]

    @pl.when(r == R)
    def _zero_padding():  # tokens at or past query_start_loc[R] get output 0
        p0 = qsl_ref[R]

        def body(j, carry):
            st = p0 + j * C
            m = ((st + rows) < T)[:, None] & vmask[None, :]
            plgpu.store(o_ref.at[pl.ds(st, C), hv, srow], jnp.zeros((C, BV), o_ref.dtype), mask=m)
            return carry

        jax.lax.fori_loop(0, (T - p0 + C - 1) // C, body, jnp.int32(0))

    def put_state(slot, sT):  # a slot that is not live (<= 0 or >= S) writes nothing
        plgpu.store(
            s_ref.at[safe_slot(slot, num_slots), hv, srow, pl.ds(0, BK)],
            sT.T.astype(s_ref.dtype),
            mask=smask & live_slot(slot, num_slots),
        )

    @pl.when(r < R)
    def _row():
        q0, q1, nc = qsl_ref[r], qsl_ref[r + 1], nc_ref[r]
        rs, ws, c0 = rs_ref[r], ws_ref[r], c0_ref[r]
        s = plgpu.load(
            s_ref.at[safe_slot(rs, num_slots), hv, srow, pl.ds(0, BK)],
            mask=smask & live_slot(rs, num_slots) & (hi_ref[r] != 0),
            other=0.0,
        ).astype(jnp.float32)
        base = q0 - nc % C  # token index of the first chunk's absolute chunk start

        def chunk(j, sT):
            tok0 = base + j * C
            st = jnp.maximum(tok0, q0)
            n = jnp.minimum(tok0 + C, q1) - st
            rmask = rows < n
            # Tiles are loaded under the masks of the rows and columns they hold (kernel 1 writes
            # them whole, padding included; masking here too keeps any unwritten byte out).
            rk, rv = rmask[:, None] & kmask[None, :], rmask[:, None] & vmask[None, :]
            tile = (c0 + j, hv, pl.ds(0, C))
            g = plgpu.load(g_ref.at[pl.ds(st, C), hv], mask=rmask, other=0.0).astype(jnp.float32)
            w = plgpu.load(w_ref.at[tile + (pl.ds(0, BK),)], mask=rk, other=0.0)
            u = plgpu.load(u_ref.at[tile + (srow,)], mask=rv, other=0.0).astype(jnp.float32)
            kd = plgpu.load(kd_ref.at[tile + (pl.ds(0, BK),)], mask=rk, other=0.0)
            qe = plgpu.load(qe_ref.at[tile + (pl.ds(0, BK),)], mask=rk, other=0.0)
            cc = rmask[:, None] & rmask[None, :]
            aqk = plgpu.load(aqk_ref.at[tile + (pl.ds(0, C),)], mask=cc, other=0.0)
            v_new = u - _mm(w, sT, dt, prec)  # [C, BV]
            o = _mm(qe, sT, dt, prec) + _mm(aqk, v_new, dt, prec)
            plgpu.store(
                o_ref.at[pl.ds(st, C), hv, srow],
                o.astype(o_ref.dtype),
                mask=rmask[:, None] & vmask[None, :],
            )
            sT = jnp.exp(jnp.sum(g)) * sT + _mm(kd, v_new, dt, prec, _TN)  # [BK, BV]
            if NB:
                p1 = nc - nc % C + (j + 1) * C  # absolute position just past this chunk
                jb = p1 // bs - nc // bs - 1
                slot = bsl_ref[r, jnp.clip(jb, 0, NB - 1)]
                hit = (p1 % bs == 0) & (tok0 + C <= q1) & (jb < NB)

                @pl.when(hit)
                def _boundary():
                    put_state(slot, sT)

            return sT

        sT = jax.lax.fori_loop(0, cnt_ref[r], chunk, s.T)
        put_state(ws, sT)


def _intra_call(
    q, k, v, g, beta, cstart, clen, *, HV: int, C: int, inter, warps: int, split: bool,
    interpret: bool, blk: int, l2: bool, scale: float, prec, sdt, refine: bool,
):  # fmt: skip
    """Per chunk tile (kernel 1, or two kernels when `split`): W, KD, QE [NC, HV, C, BK],
    U [NC, HV, C, BV], AQK [NC, HV, C, C], all in `inter` dtype."""
    HK, K = k.shape[1], k.shape[2]
    V = v.shape[2]
    BK, BVf = pow2(K), pow2(V)
    spec = _IntraSpec(rep=HV // HK, C=C, K=K, V=V, BK=BK, BV=BVf, dt=inter, sdt=sdt, prec=prec,
                      scale=scale, l2=l2, blk=blk, refine=refine)  # fmt: skip
    NCH = cstart.shape[0]
    mat = functools.partial(jax.ShapeDtypeStruct, dtype=inter)
    kt, ut, at = mat((NCH, HV, C, BK)), mat((NCH, HV, C, BVf)), mat((NCH, HV, C, C))

    def call(wy: bool, qk: bool):
        shapes = ((kt, ut) if wy else ()) + ((kt, kt, at) if qk else ())
        return pl.pallas_call(
            functools.partial(_intra_kernel, spec=spec, wy=wy, qk=qk),
            out_shape=shapes,
            grid=(NCH, HV),
            compiler_params=plgpu.CompilerParams(num_warps=warps, num_stages=1),
            interpret=interpret,
            name="gdn_chunk_intra_" + ("all" if wy and qk else "wy" if wy else "qk"),
        )(cstart, clen, q, k, v, g, beta)

    return call(True, False) + call(False, True) if split else call(True, True)


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
    block_v: int = 64,
    solve_block: int = 16,
    inter_dtype=None,
    solve_dtype=None,
    solve_refine: bool = False,
    split_intra: bool = False,
    num_warps: int = 4,
    num_stages: int = 3,
    intra_num_warps: int = 4,
    precision=None,
):
    """Pallas Gated DeltaNet prefill; same contract as `gdn_chunk_reference`.

    q, k [T, HK, K]; v [T, HV, V]; g, beta [T, HV]; state [S, HV, V, K] (updated in place);
    query_start_loc [R + 1]; num_computed, has_initial_state, read_slots, write_slots [R].
    Tuning: block_v (V rows per chain program), solve_block (diagonal block of the triangular
    inverse), inter_dtype (storage and dot operands of the per-chunk tiles and the chain; default
    v.dtype), solve_dtype / solve_refine (operands of the inverse's dots, default inter_dtype: bf16
    measured as accurate as TF32 and faster on the H100; a Newton step in fp32),
    split_intra (kernel 1 as two launches: WY factors, then the q/k tiles),
    warps/stages, precision of fp32 dots on GPU (None = HIGHEST for fp32 tiles; interpret mode
    uses HIGHEST).
    """
    check_prefill_args(q, k, v, g, beta, state, query_start_loc, num_computed, has_initial_state,
                       read_slots, write_slots, chunk_size, block_size, boundary_slots)  # fmt: skip
    T, HK, K = q.shape
    HV, V = v.shape[1], v.shape[2]
    R, C = num_computed.shape[0], chunk_size
    i32 = jnp.int32
    qsl, nc = query_start_loc.astype(i32), num_computed.astype(i32)
    cstart, clen, count, c0 = chunk_tiles(qsl, nc, T, C)
    BK, BVf = pow2(K), pow2(V)
    inter = jnp.dtype(v.dtype if inter_dtype is None else inter_dtype)
    # An fp32 model asks for fp32 results: its fp32 dots default to HIGHEST, not TF32.
    fp32_default = jax.lax.Precision.HIGHEST if inter == jnp.float32 else None
    prec = jax.lax.Precision.HIGHEST if interpret else (precision or fp32_default)
    tiles = _intra_call(
        q,
        k,
        v,
        g,
        beta,
        cstart,
        clen,
        HV=HV,
        C=C,
        inter=inter,
        warps=intra_num_warps,
        split=split_intra,
        interpret=interpret,
        blk=min(solve_block, C),
        l2=use_qk_l2norm,
        scale=float(K**-0.5 if scale is None else scale),
        prec=prec,
        sdt=inter if solve_dtype is None else jnp.dtype(solve_dtype),
        refine=solve_refine,
    )
    NB = 0 if boundary_slots is None else boundary_slots.shape[1]
    bsl = jnp.zeros((R, 1), i32) if NB == 0 else boundary_slots.astype(i32)
    BV = min(pow2(block_v), BVf)
    kern = functools.partial(
        _chain_kernel,
        R=R,
        T=T,
        C=C,
        K=K,
        V=V,
        BK=BK,
        BV=BV,
        bs=block_size or C,
        NB=NB,
        prec=prec,
        dt=inter,
    )
    meta = (qsl, nc, has_initial_state.astype(i32), read_slots.astype(i32))
    meta += (write_slots.astype(i32), c0, count, bsl)
    return pl.pallas_call(
        kern,
        out_shape=(
            jax.ShapeDtypeStruct((T, HV, V), v.dtype),
            jax.ShapeDtypeStruct(state.shape, state.dtype),
        ),
        grid=(R + 1, HV, pl.cdiv(V, BV)),
        input_output_aliases={len(meta) + 1 + len(tiles): 1},
        compiler_params=plgpu.CompilerParams(num_warps=num_warps, num_stages=num_stages),
        interpret=interpret,
        name="gdn_chunk_chain",
    )(*meta, g, *tiles, state)
