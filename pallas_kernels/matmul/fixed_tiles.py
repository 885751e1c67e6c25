"""Dense matmul with a reduction order fixed by the weight's shape: batch invariant.

Shapes (M rows, K contraction, N output columns):
  x:    [M, K]
  w:    [K, N]
  -> out [M, N] = x @ w, fp32 accumulation, in `out_dtype`

XLA's GEMM picks its algorithm by the whole shape (a matrix-vector kernel for one row, split K
for some tall products), so a row's outputs round differently with how many rows share the
product. Here every choice is static and comes from (K, N) and the tuning alone, never from M:

    program (m tile, n tile, split s):   grid (M / block_m, N / block_n, S)

      acc = 0
      for each block_k slice of split s (in order):   acc += x[tile rows, slice] @ w[slice, tile]
      partial[s, tile rows, tile] = acc               (fp32; straight to out when S = 1)

    out = (((partial[0] + partial[1]) + partial[2]) + ...)   in that order, then rounded once

A row's outputs come from the same tile shapes, the same slices in the same order and the same
adds whatever M is and wherever the row sits in its tile (the tensor-core dot of a tile computes
each row on its own), so they are bitwise the same for M = 1 and M = 4096. S splits K so that a
weight with few column tiles still spreads over the GPU at small M (decode); it costs S fp32
partial products of traffic at large M. The m tiles run fastest, so programs running together
read the same weight tile (from L2 at large M).
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plgpu

from pallas_kernels._common import check_tile_knobs, pow2, sds_like
from pallas_kernels.matmul.reference import HIGHEST, check_args


@dataclasses.dataclass(frozen=True)
class MatmulTuning:
    """Launch knobs: tiles of `block_m` rows x `block_n` columns, K in `block_k` slices (powers
    of two >= 16: tensor-core dots need 16), `num_warps`, `num_stages`; K is split in S parts until
    there are `min_programs` programs per row tile, each part keeping at least `min_split` of K.
    Static (from code, never from the batch), so a row's rounding does not depend on M. Defaults
    from `python -m benchmarks.kernels matmul --tunings sweep` on the H200 (the 0.87B model's
    projections, benchmarks/results/README.md): 128 x 128 tiles with 8 warps came close to 64- and
    32-row tiles at M = 2-64 and beat them at M = 8192."""

    block_m: int = 128
    block_n: int = 128
    block_k: int = 64
    num_warps: int = 8
    num_stages: int = 3
    min_programs: int = 128
    min_split: int = 512

    def __post_init__(self):
        check_tile_knobs(self, ("num_stages", "min_programs", "min_split"))


@dataclasses.dataclass(frozen=True)
class Plan:
    """The static shape of the product for one (K, N): tiles and K's split into `num_splits`
    parts of `split_len` (a multiple of block_k; the last part may be short)."""

    block_n: int
    block_k: int
    num_splits: int
    split_len: int


def plan(k_dim: int, n_dim: int, tuning: MatmulTuning) -> Plan:
    """Tiles and K split for a weight [K, N]: block_n and block_k shrink to the next power of two
    >= N and K (>= 16) for small weights; S doubles while the programs of one row tile are fewer
    than `min_programs` and each part keeps `min_split` of K."""
    block_n = min(tuning.block_n, max(16, pow2(n_dim)))
    block_k = min(tuning.block_k, max(16, pow2(k_dim)))
    column_tiles = pl.cdiv(n_dim, block_n)
    splits = 1
    while column_tiles * splits < tuning.min_programs and k_dim >= 2 * splits * tuning.min_split:
        splits *= 2
    split_len = pl.cdiv(pl.cdiv(k_dim, splits), block_k) * block_k
    return Plan(block_n, block_k, pl.cdiv(k_dim, split_len), split_len)


def _matmul_kernel(
    x_ref, w_ref, out_ref, *, m_dim, k_dim, n_dim, block_m, tiles, compute_dtype, precision
):
    """Program (m tile, n tile, split): the split's slices of K, in order (module docstring)."""
    mb, nb, s = pl.program_id(0), pl.program_id(1), pl.program_id(2)
    block_n, block_k = tiles.block_n, tiles.block_k
    rows = pl.ds(mb * block_m, block_m)
    row_mask = (mb * block_m + jnp.arange(block_m) < m_dim)[:, None]
    cols = pl.ds(nb * block_n, block_n)
    col_mask = (nb * block_n + jnp.arange(block_n) < n_dim)[None, :]
    k_first = s * tiles.split_len

    def k_step(j, acc):
        k0 = k_first + j * block_k
        k_mask = k0 + jnp.arange(block_k) < k_dim
        a = plgpu.load(x_ref.at[rows, pl.ds(k0, block_k)], mask=row_mask & k_mask[None, :], other=0)
        b = plgpu.load(w_ref.at[pl.ds(k0, block_k), cols], mask=k_mask[:, None] & col_mask, other=0)
        a, b = a.astype(compute_dtype), b.astype(compute_dtype)
        return acc + jnp.dot(a, b, precision=precision, preferred_element_type=jnp.float32)

    zeros = jnp.zeros((block_m, block_n), jnp.float32)
    acc = jax.lax.fori_loop(0, tiles.split_len // block_k, k_step, zeros)
    tile = out_ref.at[rows, cols] if tiles.num_splits == 1 else out_ref.at[s, rows, cols]
    plgpu.store(tile, acc.astype(out_ref.dtype), mask=row_mask & col_mask)


@functools.partial(jax.jit, static_argnames=("out_dtype", "tuning", "interpret"))
def matmul(
    x: jax.Array,
    w: jax.Array,
    *,
    out_dtype=jnp.float32,
    tuning: MatmulTuning = MatmulTuning(),
    interpret: bool = False,
) -> jax.Array:
    """Pallas kernel for `matmul_reference` (same arguments and result, within rounding), whose
    rounding of a row does not depend on the other rows (module docstring). fp32 operands use
    full-precision fp32 dots."""
    check_args(x, w, out_dtype)
    m_dim, k_dim = x.shape
    n_dim = w.shape[1]
    if m_dim == 0:
        return jnp.zeros((0, n_dim), out_dtype)
    shape = plan(k_dim, n_dim, tuning)
    kernel = functools.partial(
        _matmul_kernel,
        m_dim=m_dim,
        k_dim=k_dim,
        n_dim=n_dim,
        block_m=tuning.block_m,
        tiles=shape,
        compute_dtype=x.dtype,
        precision=HIGHEST if x.dtype == jnp.float32 else None,
    )
    return launch(kernel, (x, w), shape, tuning, n_dim, out_dtype, interpret, "matmul")


def launch(
    kernel,
    operands: tuple[jax.Array, ...],
    shape: Plan,
    tuning: MatmulTuning,
    n_dim: int,
    out_dtype,
    interpret: bool,
    name: str,
) -> jax.Array:
    """Run a fixed-tile `kernel` over `operands` (rows first, [M, K]) on the grid of `shape`
    (m tiles, n tiles, K splits), then add the splits' fp32 partial products in order and round
    once (one split writes `out_dtype` straight away)."""
    x = operands[0]
    m_dim = x.shape[0]
    split = shape.num_splits > 1
    partials = pl.pallas_call(
        kernel,
        out_shape=sds_like(
            x,
            (shape.num_splits, m_dim, n_dim) if split else (m_dim, n_dim),
            jnp.float32 if split else out_dtype,
        ),
        grid=(pl.cdiv(m_dim, tuning.block_m), pl.cdiv(n_dim, shape.block_n), shape.num_splits),
        compiler_params=plgpu.CompilerParams(
            num_warps=tuning.num_warps, num_stages=tuning.num_stages
        ),
        interpret=interpret,
        name=name,
    )(*operands)
    if not split:
        return partials
    return functools.reduce(jnp.add, list(partials)).astype(out_dtype)  # in order, rounded once
