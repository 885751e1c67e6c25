"""Kernel 1 of the Gated DeltaNet prefill (`gdn_chunk`): every per-chunk tile that does not depend
on the state, all chunks in parallel (grid: chunk tiles x value heads).

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

from pallas_kernels._common import pow2
from pallas_kernels.gdn_reference import L2_EPS

NN = (((1,), (0,)), ((), ()))  # a @ b
NT = (((1,), (1,)), ((), ()))  # a @ b.T
TN = (((0,), (0,)), ((), ()))  # a.T @ b


def mm(a, b, dt, prec, dims=NN):
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
            P = mm(P, P, dt, prec)
            acc = mm(acc, eye + P, dt, prec)
            m *= 2
        return acc

    D = neumann(jnp.where(same, A, 0.0), blk)
    Tinv = D
    if blk < C:
        N = mm(D, jnp.where(same, 0.0, A), dt, prec)
        Tinv = mm(neumann(N, C // blk), D, dt, prec)
    if refine:
        f32 = jnp.float32
        Tinv = 2.0 * Tinv - mm(Tinv, mm(eye + A, Tinv, f32, prec), f32, prec)
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
        A = jnp.where(ii > jj, beta[:, None] * mm(k, k, dt, prec, NT) * dec, 0.0)
        Tinv = _unit_lower_inverse(A, spec.blk, spec.sdt, prec, spec.refine)
        put(mm(Tinv, (beta * eG)[:, None] * k, dt, prec))  # W
        v = plgpu.load(
            v_ref.at[pl.ds(st, C), hv, pl.ds(0, BV)],
            mask=rmask[:, None] & vmask[None, :],
            other=0.0,
        )
        put(mm(Tinv, beta[:, None] * v.astype(jnp.float32), dt, prec))  # U
    if qk:
        put(jnp.exp(jnp.sum(g) - G)[:, None] * k)  # KD
        q = load_qk(q_ref)
        put((spec.scale * eG)[:, None] * q)  # QE
        put((spec.scale * mm(q, k, dt, prec, NT)) * dec)  # AQK


def intra_tiles(
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
