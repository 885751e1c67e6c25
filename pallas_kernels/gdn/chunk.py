"""Gated DeltaNet chunked prefill over ragged `Rows`, slots read and written in-kernel: two kernels.

1. `intra.intra_tiles`, grid (chunk tiles, HV), all chunks in parallel. Everything that does not
   depend on the state: the WY factors W, U and the tiles KD, QE, AQK the chain uses.
2. `_chain_kernel`, grid (R + 1, HV, V tiles): sequential over the chunks of one row with the
   transposed state slice S^T [K, BV] in fp32 registers. Per chunk only four small dots:
   v_new = U - W S^T, o = QE S^T + AQK v_new, S^T = exp(G_last) S^T + KD^T v_new. Reads the
   initial state from its slot, writes block-boundary states and the final state to theirs.
   Program R zeroes the padding tokens.
Dot operands are in `ChunkTuning.inter_dtype` (bf16 for bf16 inputs: tensor cores, fp32
accumulation); the triangular inverse uses `solve_dtype` (default the same; fp32 = TF32 on GPU).
Chunks are aligned to absolute positions (num_computed), so results do not depend on chunking. The
math is `gdn_chunk_reference_chunked` (`gdn/reference_chunked.py`).
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plgpu

from pallas_kernels._common import live_slot, pow2, safe_slot
from pallas_kernels.gdn.intra import TN, IntraSpec, intra_tiles, mm
from pallas_kernels.gdn.reference import check_chunk_args
from pallas_kernels.gdn.reference_chunked import chunk_table
from pallas_kernels.rows import Rows


@dataclasses.dataclass(frozen=True)
class ChunkTuning:
    """Launch knobs of the two GDN prefill kernels. Static: from code, never from the batch (the
    dtypes and the inverse's blocking change a row's rounding).

    `block_v` V rows per chain program; `solve_block` the diagonal block of the triangular inverse;
    `inter_dtype` storage and dot operands of the per-chunk tiles and the chain (None = v's dtype);
    `solve_dtype` operands of the inverse's dots (None = inter_dtype: bf16 measured as accurate as
    TF32 and faster on the H100) and `solve_refine` one Newton step on it in fp32; `split_intra`
    kernel 1 as two launches (WY factors, then the q / k tiles); `num_warps` / `num_stages` of the
    chain (stages None = `chain_stages`: up to 3, fewer where the per-chunk tiles would overflow
    shared memory); `intra_num_warps` of kernel 1; `precision` of fp32 dots on the GPU (None =
    HIGHEST for fp32 tiles; interpret mode always uses HIGHEST).

    `block_v` 64: on the H200 well ahead of 32 at 8 x 2048 tokens and on par at 1 x 8192
    (benchmarks/results/README.md, beside FLA's kernels). V columns are independent, so the
    choice does not change the outputs.
    """

    block_v: int = 64
    solve_block: int = 16
    inter_dtype: Any = None
    solve_dtype: Any = None
    solve_refine: bool = False
    split_intra: bool = False
    num_warps: int = 4
    num_stages: int | None = None
    intra_num_warps: int = 4
    precision: jax.lax.Precision | None = None


def _chain_kernel(
    qsl_ref,
    nc_ref,
    init_ref,
    read_ref,
    write_ref,
    c0_ref,
    count_ref,
    bnd_ref,
    g_ref,
    w_ref,
    u_ref,
    kd_ref,
    qe_ref,
    aqk_ref,
    state_in_ref,
    o_ref,
    s_ref,
    *,
    num_rows,
    num_tokens,
    chunk,
    k_dim,
    v_dim,
    block_k,
    block_v,
    block_size,
    num_boundaries,
    precision,
    dtype,
):
    """Program (row, value head, V tile): the row's chunks in order, S^T in registers; row R
    zeroes the padding tokens."""
    del state_in_ref  # aliased to s_ref
    r, hv, vt = pl.program_id(0), pl.program_id(1), pl.program_id(2)
    rows = jnp.arange(chunk)
    kmask = jnp.arange(block_k) < k_dim
    vmask = (vt * block_v + jnp.arange(block_v)) < v_dim
    smask = vmask[:, None] & kmask[None, :]
    srow = pl.ds(vt * block_v, block_v)
    num_slots = s_ref.shape[0]

    dot = functools.partial(mm, dtype=dtype, precision=precision)

    @pl.when(r == num_rows)
    def _zero_padding():  # tokens at or past query_start_loc[R] get output 0
        p0 = qsl_ref[num_rows]

        def body(j, carry):
            st = p0 + j * chunk
            m = ((st + rows) < num_tokens)[:, None] & vmask[None, :]
            zeros = jnp.zeros((chunk, block_v), o_ref.dtype)
            plgpu.store(o_ref.at[pl.ds(st, chunk), hv, srow], zeros, mask=m)
            return carry

        jax.lax.fori_loop(0, (num_tokens - p0 + chunk - 1) // chunk, body, jnp.int32(0))

    def put_state(slot, sT):  # a slot that is not live (<= 0 or >= S) writes nothing
        plgpu.store(
            s_ref.at[safe_slot(slot, num_slots), hv, srow, pl.ds(0, block_k)],
            sT.T.astype(s_ref.dtype),
            mask=smask & live_slot(slot, num_slots),
        )

    @pl.when(r < num_rows)
    def _row():
        q0, q1, nc = qsl_ref[r], qsl_ref[r + 1], nc_ref[r]
        read, write, c0 = read_ref[r], write_ref[r], c0_ref[r]
        s = plgpu.load(
            s_ref.at[safe_slot(read, num_slots), hv, srow, pl.ds(0, block_k)],
            mask=smask & live_slot(read, num_slots) & (init_ref[r] != 0),
            other=0.0,
        ).astype(jnp.float32)
        base = q0 - nc % chunk  # token index of the first chunk's absolute chunk start

        def one_chunk(j, sT):
            tok0 = base + j * chunk
            st = jnp.maximum(tok0, q0)
            n = jnp.minimum(tok0 + chunk, q1) - st
            rmask = rows < n
            # Tiles are loaded under the masks of the rows and columns they hold (kernel 1 writes
            # them whole, padding included; masking here too keeps any unwritten byte out).
            rk, rv = rmask[:, None] & kmask[None, :], rmask[:, None] & vmask[None, :]
            tile = (c0 + j, hv, pl.ds(0, chunk))
            g = plgpu.load(g_ref.at[pl.ds(st, chunk), hv], mask=rmask, other=0.0)
            g = g.astype(jnp.float32)
            w = plgpu.load(w_ref.at[tile + (pl.ds(0, block_k),)], mask=rk, other=0.0)
            u = plgpu.load(u_ref.at[tile + (srow,)], mask=rv, other=0.0).astype(jnp.float32)
            kd = plgpu.load(kd_ref.at[tile + (pl.ds(0, block_k),)], mask=rk, other=0.0)
            qe = plgpu.load(qe_ref.at[tile + (pl.ds(0, block_k),)], mask=rk, other=0.0)
            cc = rmask[:, None] & rmask[None, :]
            aqk = plgpu.load(aqk_ref.at[tile + (pl.ds(0, chunk),)], mask=cc, other=0.0)
            v_new = u - dot(w, sT)  # [C, BV]
            o = dot(qe, sT) + dot(aqk, v_new)
            plgpu.store(
                o_ref.at[pl.ds(st, chunk), hv, srow],
                o.astype(o_ref.dtype),
                mask=rmask[:, None] & vmask[None, :],
            )
            sT = jnp.exp(jnp.sum(g)) * sT + dot(kd, v_new, dims=TN)  # [BK, BV]
            if num_boundaries:
                p1 = nc - nc % chunk + (j + 1) * chunk  # absolute position just past this chunk
                jb = p1 // block_size - nc // block_size - 1
                slot = bnd_ref[r, jnp.clip(jb, 0, num_boundaries - 1)]
                hit = (p1 % block_size == 0) & (tok0 + chunk <= q1) & (jb < num_boundaries)

                @pl.when(hit)
                def _boundary():
                    put_state(slot, sT)

            return sT

        sT = jax.lax.fori_loop(0, count_ref[r], one_chunk, s.T)
        put_state(write, sT)


def chunk_tiles(query_start_loc, num_computed, num_tokens: int, chunk: int):
    """Per chunk tile: first token and token count (int32 [NC]); per row: chunk count and first
    tile index (int32 [R]). Chunks are aligned to absolute positions."""
    i32 = jnp.int32
    qsl, nc = query_start_loc.astype(i32), num_computed.astype(i32)
    num_rows = nc.shape[0]
    row, tok0, _, _, _ = chunk_table(qsl, nc, num_tokens, chunk)
    rowc = jnp.minimum(row, num_rows - 1)
    cstart = jnp.maximum(tok0, qsl[rowc])
    clen = jnp.where(row < num_rows, jnp.minimum(tok0 + chunk, qsl[rowc + 1]) - cstart, 0)
    length = qsl[1:] - qsl[:-1]
    count = jnp.where(length > 0, (nc % chunk + length + chunk - 1) // chunk, 0).astype(i32)
    c0 = (jnp.cumsum(count) - count).astype(i32)
    return cstart.astype(i32), clen.astype(i32), count, c0


# Shared memory per block on the H100 (what Triton reports as available).
_SMEM_BYTES = 227 * 1024


def chain_stages(chunk: int, block_k: int, block_v: int, itemsize: int, most: int = 3) -> int:
    """Pipeline stages of the chain kernel: `most` (3 measured fastest at the Qwen3-Next shape in
    bf16), fewer where the tiles one chunk loads would overflow shared memory. Fitted to what
    Triton asked on the H100: a buffer per stage for W, KD, QE [C, BK] and U [C, BV], one fewer
    for AQK [C, C] (bf16, C 128, K 128: 256 KiB at BV 64 and 240 KiB at BV 32 for 2 stages).
    A function of the static shapes only, never of the batch."""

    def need(stages: int) -> int:
        tiles = stages * (3 * chunk * block_k + chunk * block_v) + (stages - 1) * chunk * chunk
        return tiles * itemsize

    return max([1] + [s for s in range(2, most + 1) if need(s) <= _SMEM_BYTES])


def intra_spec(q, v, scale, use_qk_l2norm, chunk: int, tuning: ChunkTuning, interpret: bool):
    """Kernel 1's statics; its tile dtype and dot precision are the chain's too."""
    k_dim, v_dim = q.shape[2], v.shape[2]
    dtype = jnp.dtype(v.dtype if tuning.inter_dtype is None else tuning.inter_dtype)
    # An fp32 model asks for fp32 results: its fp32 dots default to HIGHEST, not TF32.
    fp32_default = jax.lax.Precision.HIGHEST if dtype == jnp.float32 else None
    return IntraSpec(
        heads_per_key=v.shape[1] // q.shape[1],
        chunk=chunk,
        k_dim=k_dim,
        v_dim=v_dim,
        block_k=pow2(k_dim),
        block_v=pow2(v_dim),
        dtype=dtype,
        solve_dtype=dtype if tuning.solve_dtype is None else jnp.dtype(tuning.solve_dtype),
        precision=jax.lax.Precision.HIGHEST if interpret else (tuning.precision or fp32_default),
        scale=float(k_dim**-0.5 if scale is None else scale),
        l2norm=use_qk_l2norm,
        solve_block=min(tuning.solve_block, chunk),
        solve_refine=tuning.solve_refine,
    )


@functools.partial(
    jax.jit, static_argnames=("scale", "use_qk_l2norm", "chunk_size", "tuning", "interpret")
)
def gdn_chunk(
    q: jax.Array,
    k: jax.Array,
    v: jax.Array,
    g: jax.Array,
    beta: jax.Array,
    state: jax.Array,
    rows: Rows,
    *,
    scale: float | None = None,
    use_qk_l2norm: bool = True,
    chunk_size: int = 64,
    tuning: ChunkTuning = ChunkTuning(),
    interpret: bool = False,
) -> tuple[jax.Array, jax.Array]:
    """Pallas kernels for `gdn_chunk_reference` (same arguments and results).

    q, k [T, HK, K]; v [T, HV, V]; g, beta [T, HV]; state [S, HV, V, K], aliased to the returned
    pool (donate it under jit to update in place).
    """
    num_rows = check_chunk_args(q, k, v, g, beta, state, rows, chunk_size)
    num_tokens, _, k_dim = q.shape
    v_heads, v_dim = v.shape[1], v.shape[2]
    qsl, nc, has_init, read, write, bnd = rows.int32_operands()
    cstart, clen, count, c0 = chunk_tiles(qsl, nc, num_tokens, chunk_size)
    spec = intra_spec(q, v, scale, use_qk_l2norm, chunk_size, tuning, interpret)
    warps, split = tuning.intra_num_warps, tuning.split_intra
    tiles = intra_tiles(
        q, k, v, g, beta, cstart, clen, spec, num_warps=warps, split=split, interpret=interpret
    )
    num_boundaries = 0 if rows.boundary_slots is None else rows.boundary_slots.shape[1]
    block_v = min(pow2(tuning.block_v), spec.block_v)
    kernel = functools.partial(
        _chain_kernel,
        num_rows=num_rows,
        num_tokens=num_tokens,
        chunk=chunk_size,
        k_dim=k_dim,
        v_dim=v_dim,
        block_k=spec.block_k,
        block_v=block_v,
        block_size=rows.block_size or chunk_size,
        num_boundaries=num_boundaries,
        precision=spec.precision,
        dtype=spec.dtype,
    )
    meta = (qsl, nc, has_init, read, write, c0, count, bnd)
    itemsize = spec.dtype.itemsize
    stages = tuning.num_stages or chain_stages(chunk_size, spec.block_k, block_v, itemsize)
    return pl.pallas_call(
        kernel,
        out_shape=(
            jax.ShapeDtypeStruct((num_tokens, v_heads, v_dim), v.dtype),
            jax.ShapeDtypeStruct(state.shape, state.dtype),
        ),
        grid=(num_rows + 1, v_heads, pl.cdiv(v_dim, block_v)),
        input_output_aliases={len(meta) + 1 + len(tiles): 1},
        compiler_params=plgpu.CompilerParams(num_warps=tuning.num_warps, num_stages=stages),
        interpret=interpret,
        name="gdn_chunk_chain",
    )(*meta, g, *tiles, state)
