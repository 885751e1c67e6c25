"""Kernel 1 of the Gated DeltaNet prefill (`gdn/chunk.py`): every per-chunk tile that does not
depend on the state, all chunks in parallel (grid: chunk tiles x value heads).

l2norm(q, k), the in-chunk cumulative log decay G, A = strict-lower(beta_i (k_i . k_j)
exp(G_i - G_j)), T = (I + A)^-1 (blocked doubling products, all dots), the WY factors
W = T (beta exp(G) k), U = T (beta v), and the tiles the chain needs as it uses them:
KD = exp(G_last - G) k, QE = scale exp(G) q, AQK = scale (q k^T) o causal decay.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plgpu

from pallas_kernels.gdn.reference import L2_EPS

NN = (((1,), (0,)), ((), ()))  # a @ b
NT = (((1,), (1,)), ((), ()))  # a @ b.T
TN = (((0,), (0,)), ((), ()))  # a.T @ b


def mm(a, b, dtype, precision, dims=NN):
    """a @ b (per dims) with operands cast to `dtype`, fp32 accumulation; `precision` applies only
    to fp32 operands."""
    p = precision if dtype == jnp.float32 else None
    return jax.lax.dot_general(
        a.astype(dtype), b.astype(dtype), dims, precision=p, preferred_element_type=jnp.float32
    )


def _l2n_rows(x: jax.Array) -> jax.Array:
    return x * jax.lax.rsqrt(jnp.sum(x * x, axis=1) + L2_EPS)[:, None]


def _unit_lower_inverse(A: jax.Array, blk: int, dtype, precision, refine: bool) -> jax.Array:
    """(I + A)^-1 for strictly lower-triangular A [C, C], with dots only (operands in `dtype`).

    Diagonal blocks of size blk: (I + X)^-1 = (I - X)(I + X^2)(I + X^4)... (X^blk = 0). Then with D
    the block-diagonal inverse and N = D A_off (strictly block-lower, N^(C/blk) = 0),
    (I + A)^-1 = (I + N)^-1 D, the same doubling product over the blocks. `refine`: one Newton
    step T <- 2T - T (I + A) T with fp32 (TF32) operands, for a low-precision `dtype`.
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
            P = mm(P, P, dtype, precision)
            acc = mm(acc, eye + P, dtype, precision)
            m *= 2
        return acc

    D = neumann(jnp.where(same, A, 0.0), blk)
    Tinv = D
    if blk < C:
        N = mm(D, jnp.where(same, 0.0, A), dtype, precision)
        Tinv = mm(neumann(N, C // blk), D, dtype, precision)
    if refine:
        f32 = jnp.float32
        Tinv = 2.0 * Tinv - mm(Tinv, mm(eye + A, Tinv, f32, precision), f32, precision)
    return Tinv


@dataclasses.dataclass(frozen=True)
class IntraSpec:
    """Static shapes and arithmetic of kernel 1.

    heads_per_key: value heads per key head; chunk: tokens per chunk; k_dim, v_dim: head dims;
    block_k, block_v: their power-of-two blocks; dtype: tile storage and dot operands;
    solve_dtype: operands of the inverse's dots; precision: of fp32 dots; scale: q scale; l2norm:
    l2-normalise q and k; solve_block: diagonal block of the inverse; solve_refine: one Newton
    step on the inverse.
    """

    heads_per_key: int
    chunk: int
    k_dim: int
    v_dim: int
    block_k: int
    block_v: int
    dtype: jnp.dtype
    solve_dtype: jnp.dtype
    precision: jax.lax.Precision | None
    scale: float
    l2norm: bool
    solve_block: int
    solve_refine: bool


def _intra_kernel(
    cstart_ref,
    clen_ref,
    q_ref,
    k_ref,
    v_ref,
    g_ref,
    b_ref,
    *out_refs,
    spec: IntraSpec,
    wy: bool,
    qk: bool,
):
    """Kernel 1 body: `wy` writes W, U; `qk` writes KD, QE, AQK (in that order). Tiles are computed
    and stored one after another so few stay live in registers.

    Every tile is stored whole, its padding columns (K..BK, V..BV: zeros, from masked loads)
    included, so no later reader can meet memory that nothing wrote.
    """
    chunk, dtype, precision = spec.chunk, spec.dtype, spec.precision
    c, hv = pl.program_id(0), pl.program_id(1)
    st, n = cstart_ref[c], clen_ref[c]
    rows = jnp.arange(chunk)
    rmask = rows < n
    kmask = jnp.arange(spec.block_k) < spec.k_dim
    vmask = jnp.arange(spec.block_v) < spec.v_dim
    qk_at = (pl.ds(st, chunk), hv // spec.heads_per_key, pl.ds(0, spec.block_k))
    qk_mask = rmask[:, None] & kmask[None, :]
    outs = list(out_refs)

    def put(x):
        ref = outs.pop(0)
        plgpu.store(ref.at[c, hv, pl.ds(0, chunk), pl.ds(0, x.shape[1])], x.astype(ref.dtype))

    def load_qk(ref):
        x = plgpu.load(ref.at[qk_at], mask=qk_mask, other=0.0).astype(jnp.float32)
        return _l2n_rows(x) if spec.l2norm else x

    k = load_qk(k_ref)
    g = plgpu.load(g_ref.at[pl.ds(st, chunk), hv], mask=rmask, other=0.0).astype(jnp.float32)
    G = jnp.cumsum(g)
    eG = jnp.exp(G)
    ii, jj = rows[:, None], rows[None, :]
    dec = jnp.where(ii >= jj, jnp.exp(jnp.where(ii >= jj, G[:, None] - G[None, :], 0.0)), 0.0)
    if wy:
        beta = plgpu.load(b_ref.at[pl.ds(st, chunk), hv], mask=rmask, other=0.0)
        beta = beta.astype(jnp.float32)
        A = jnp.where(ii > jj, beta[:, None] * mm(k, k, dtype, precision, NT) * dec, 0.0)
        Tinv = _unit_lower_inverse(
            A, spec.solve_block, spec.solve_dtype, precision, spec.solve_refine
        )
        put(mm(Tinv, (beta * eG)[:, None] * k, dtype, precision))  # W
        v = plgpu.load(
            v_ref.at[pl.ds(st, chunk), hv, pl.ds(0, spec.block_v)],
            mask=rmask[:, None] & vmask[None, :],
            other=0.0,
        )
        put(mm(Tinv, beta[:, None] * v.astype(jnp.float32), dtype, precision))  # U
    if qk:
        put(jnp.exp(jnp.sum(g) - G)[:, None] * k)  # KD
        q = load_qk(q_ref)
        put((spec.scale * eG)[:, None] * q)  # QE
        put((spec.scale * mm(q, k, dtype, precision, NT)) * dec)  # AQK


def intra_tiles(
    q,
    k,
    v,
    g,
    beta,
    chunk_start,
    chunk_len,
    spec: IntraSpec,
    *,
    num_warps: int,
    split: bool,
    interpret: bool,
):
    """Per chunk tile (kernel 1, or two kernels when `split`): W, KD, QE [NC, HV, C, BK],
    U [NC, HV, C, BV], AQK [NC, HV, C, C], all in `spec.dtype`. chunk_start / chunk_len [NC]: each
    tile's first flat token and token count."""
    v_heads, chunk = v.shape[1], spec.chunk
    num_tiles = chunk_start.shape[0]
    mat = functools.partial(jax.ShapeDtypeStruct, dtype=spec.dtype)
    kt = mat((num_tiles, v_heads, chunk, spec.block_k))
    ut = mat((num_tiles, v_heads, chunk, spec.block_v))
    at = mat((num_tiles, v_heads, chunk, chunk))

    def call(wy: bool, qk: bool):
        shapes = ((kt, ut) if wy else ()) + ((kt, kt, at) if qk else ())
        return pl.pallas_call(
            functools.partial(_intra_kernel, spec=spec, wy=wy, qk=qk),
            out_shape=shapes,
            grid=(num_tiles, v_heads),
            compiler_params=plgpu.CompilerParams(num_warps=num_warps, num_stages=1),
            interpret=interpret,
            name="gdn_chunk_intra_" + ("all" if wy and qk else "wy" if wy else "qk"),
        )(chunk_start, chunk_len, q, k, v, g, beta)

    return call(True, False) + call(False, True) if split else call(True, True)
