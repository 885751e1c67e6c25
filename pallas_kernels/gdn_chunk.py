"""Gated DeltaNet chunked prefill (varlen, slots in-kernel), Pallas/Triton, two kernels.

1. `_gdn_intra.intra_tiles`, grid (chunk tiles, HV), all chunks in parallel. Everything that does
   not depend on the state: the WY factors W, U and the tiles KD, QE, AQK the chain uses.
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

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plgpu

from pallas_kernels._common import live_slot, pow2, safe_slot
from pallas_kernels._gdn_intra import TN, intra_tiles, mm
from pallas_kernels.gdn_reference import (
    check_prefill_args,
    chunk_table,
    gdn_chunk_reference,
    gdn_chunk_reference_chunked,
)

__all__ = ["gdn_chunk", "gdn_chunk_reference", "gdn_chunk_reference_chunked"]


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
            v_new = u - mm(w, sT, dt, prec)  # [C, BV]
            o = mm(qe, sT, dt, prec) + mm(aqk, v_new, dt, prec)
            plgpu.store(
                o_ref.at[pl.ds(st, C), hv, srow],
                o.astype(o_ref.dtype),
                mask=rmask[:, None] & vmask[None, :],
            )
            sT = jnp.exp(jnp.sum(g)) * sT + mm(kd, v_new, dt, prec, TN)  # [BK, BV]
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


# Shared memory per block on the H100 (what Triton reports as available).
_SMEM_BYTES = 227 * 1024


def chain_stages(C: int, BK: int, BV: int, itemsize: int, most: int = 3) -> int:
    """Pipeline stages of the chain kernel: `most` (3 measured fastest at the Qwen3-Next shape in
    bf16), fewer where the tiles one chunk loads would overflow shared memory. Fitted to what
    Triton asked on the H100: a buffer per stage for W, KD, QE [C, BK] and U [C, BV], one fewer
    for AQK [C, C] (bf16, C 128, K 128: 256 KiB at BV 64 and 240 KiB at BV 32 for 2 stages).
    A function of the static shapes only, never of the batch."""

    def need(stages: int) -> int:
        return (stages * (3 * C * BK + C * BV) + (stages - 1) * C * C) * itemsize

    return max([1] + [s for s in range(2, most + 1) if need(s) <= _SMEM_BYTES])


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
    solve_dtype=None,
    solve_refine: bool = False,
    split_intra: bool = False,
    num_warps: int = 4,
    num_stages: int | None = None,
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
    warps/stages (stages None = `chain_stages`: up to 3, fewer where the per-chunk tiles would
    overflow shared memory), precision of fp32 dots on GPU (None = HIGHEST for fp32 tiles;
    interpret mode uses HIGHEST).
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
    tiles = intra_tiles(
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
        compiler_params=plgpu.CompilerParams(
            num_warps=num_warps,
            num_stages=num_stages or chain_stages(C, BK, BV, inter.itemsize),
        ),
        interpret=interpret,
        name="gdn_chunk_chain",
    )(*meta, g, *tiles, state)
