"""Weight-only FP8 matmul: activations in their own dtype (bf16) times e4m3 weights with fp32
block scales, the weight read once as 1 byte an entry. Batch invariant.

Shapes (M rows, K contraction, N output columns; scales as in `matmul/fp8_reference.py`):
  x:     [M, K]        bf16 (fp16, fp32)
  w:     [K, N]        float8_e4m3fn
  scale: [G_k, G_n]    fp32, one per `block` = (rows along K, columns along N) of w, 0: the axis
  -> out [M, N] = x @ (w * scale), fp32 accumulation, rounded once to `out_dtype`

At decode sizes (M <= 256) a projection is memory bound: reading half the bytes of a bf16 weight
is the point, so the weight stays e4m3 in memory and is converted in registers (e4m3 is exact in
bf16, fp16 and fp32) to x's dtype for a tensor-core dot. The scale is applied to the fp32
accumulator, never to the entries, so no product is rounded before it is summed:

    program (m tile, n tile, split s):   grid (M / block_m, N / block_n, S)

      acc = 0
      for each block_k slice of split s (in order):
          p = x[tile rows, slice] @ w[slice, tile]            (fp32, exact products)
          acc += p * scale[slice's K group, tile's column groups]   (G_k > 1: K-blocked scales)
          acc += p                                                 (G_k = 1)
      acc *= scale[0, tile's column groups]                        (G_k = 1)
      partial[s, tile rows, tile] = acc                    (fp32; straight to out when S = 1)

    out = (((partial[0] + partial[1]) + partial[2]) + ...)   in that order, then rounded once

With scales blocked along K (a checkpoint's 128 x 128 tiles) block_k divides the block's rows, so
every slice lies in one K group and its partial product is scaled exactly once before it is
accumulated (`supports_block`: the block's rows must be a multiple of 16, the smallest dot K; a
weight whose scale does not vary along K takes any block). As in `fixed_tiles.py`, tiles, slices
and the split come from (K, N, block) and the tuning alone, never from M, so a row's outputs are
bitwise the same for M = 1 and M = 4096; the m tiles run fastest, so programs running together
read the same weight tile.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plgpu

from pallas_kernels.matmul.fixed_tiles import MatmulTuning, Plan, launch, plan
from pallas_kernels.matmul.fp8_reference import Block, check_fp8_args, scale_shape
from pallas_kernels.matmul.reference import HIGHEST

MIN_DOT_K = 16  # the smallest K slice a tensor-core dot takes

# Decode first: a 16-row tile does 1/8 of the dead tensor-core work of fixed_tiles' 128-row tile
# at M = 1 (the FP8 weight is read in half the time, so that work would show), 64 columns give
# 128 programs of a 2048 x 8192 weight without a split (8192 x 2048 splits K in 4: a sum of
# partials after the kernel). At M = 256 the 16 row tiles read each weight tile 16 times (from
# L2, the m tiles running together), and at prefill sizes small tiles cost more still. Not yet
# measured on the GPU: `python -m benchmarks.kernels fp8_linear --tunings sweep` times larger
# tiles and the other knobs beside this one.
FP8_TUNING = MatmulTuning(block_m=16, block_n=64, block_k=128, num_warps=4, num_stages=4)


def k_groups(k_dim: int, block: Block) -> int:
    """How many scales the weight has along K (1: the scale does not vary along K)."""
    return scale_shape(k_dim, 1, (block[0], 0))[0]


def supports_block(k_dim: int, block: Block) -> bool:
    """Whether the kernel takes a weight of K rows in `block`s: its scale does not vary along K,
    or the block's rows are a multiple of 16 (each K slice then lies in one block)."""
    return k_groups(k_dim, block) == 1 or block[0] % MIN_DOT_K == 0


def fp8_plan(k_dim: int, n_dim: int, block: Block, tuning: MatmulTuning) -> Plan:
    """`fixed_tiles.plan` of the weight, block_k shrunk to the largest power of two dividing the
    block's rows where the scale varies along K (the split stays a multiple of it)."""
    shape = plan(k_dim, n_dim, tuning)
    if k_groups(k_dim, block) == 1:
        return shape
    return dataclasses.replace(shape, block_k=min(shape.block_k, block[0] & -block[0]))


def _fp8_weights_kernel(
    x_ref, w_ref, scale_ref, out_ref, *, dims, block_m, tiles, block, compute_dtype, precision
):
    """Program (m tile, n tile, split): the split's slices of K, in order (module docstring)."""
    m_dim, k_dim, n_dim = dims
    mb, nb, s = pl.program_id(0), pl.program_id(1), pl.program_id(2)
    block_n, block_k = tiles.block_n, tiles.block_k
    groups_k, groups_n = scale_ref.shape
    rows = pl.ds(mb * block_m, block_m)
    row_mask = (mb * block_m + jnp.arange(block_m) < m_dim)[:, None]
    col_ids = nb * block_n + jnp.arange(block_n)
    col_mask = (col_ids < n_dim)[None, :]
    cols = pl.ds(nb * block_n, block_n)
    # Each column's scale column, clamped so that masked columns read a real scale.
    col_group = jnp.minimum(col_ids // block[1], groups_n - 1) if block[1] else col_ids * 0
    k_first = s * tiles.split_len

    def scales(group_k):  # [1, block_n]: the tile's scales in K group `group_k`
        group = jnp.full((1, block_n), jnp.minimum(group_k, groups_k - 1), jnp.int32)
        return plgpu.load(scale_ref.at[group, col_group[None, :]])

    def k_step(j, acc):
        k0 = k_first + j * block_k
        k_mask = k0 + jnp.arange(block_k) < k_dim
        a = plgpu.load(
            x_ref.at[rows, pl.ds(k0, block_k)], mask=row_mask & k_mask[None, :], other=0.0
        )
        b = plgpu.load(
            w_ref.at[pl.ds(k0, block_k), cols], mask=k_mask[:, None] & col_mask, other=0.0
        )
        a, b = a.astype(compute_dtype), b.astype(compute_dtype)
        part = jnp.dot(a, b, precision=precision, preferred_element_type=jnp.float32)
        return acc + (part * scales(k0 // block[0]) if groups_k > 1 else part)

    zeros = jnp.zeros((block_m, block_n), jnp.float32)
    acc = jax.lax.fori_loop(0, tiles.split_len // block_k, k_step, zeros)
    if groups_k == 1:
        acc = acc * scales(0)
    tile = out_ref.at[rows, cols] if tiles.num_splits == 1 else out_ref.at[s, rows, cols]
    plgpu.store(tile, acc.astype(out_ref.dtype), mask=row_mask & col_mask)


@functools.partial(jax.jit, static_argnames=("block", "out_dtype", "tuning", "interpret"))
def fp8_weight_matmul(
    x: jax.Array,
    w: jax.Array,
    scale: jax.Array,
    *,
    block: Block,
    out_dtype=jnp.bfloat16,
    tuning: MatmulTuning = FP8_TUNING,
    interpret: bool = False,
) -> jax.Array:
    """Pallas kernel for `fp8_weight_matmul_reference` (same arguments and result, within fp32
    rounding), whose rounding of a row does not depend on the other rows (module docstring).
    ValueError for a block the kernel does not take (`supports_block`)."""
    check_fp8_args(x, w, scale, block, out_dtype)
    m_dim, k_dim = x.shape
    n_dim = w.shape[1]
    if not supports_block(k_dim, block):
        raise ValueError(
            f"block={block} with w of shape {tuple(w.shape)}: scales blocked along K need block "
            f"rows that are a multiple of {MIN_DOT_K} (the kernel's K slices lie in one block)"
        )
    if m_dim == 0:
        return jnp.zeros((0, n_dim), out_dtype)
    shape = fp8_plan(k_dim, n_dim, block, tuning)
    kernel = functools.partial(
        _fp8_weights_kernel,
        dims=(m_dim, k_dim, n_dim),
        block_m=tuning.block_m,
        tiles=shape,
        block=block,
        compute_dtype=x.dtype,
        precision=HIGHEST if x.dtype == jnp.float32 else None,
    )
    operands = (x, w, scale)
    return launch(kernel, operands, shape, tuning, n_dim, out_dtype, interpret, "fp8_weight_matmul")
