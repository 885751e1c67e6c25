"""Each row's sum of squares, in an order fixed by the row's length alone: batch invariant.

Shapes (R rows of D values):
  x:    [R, D]   any floating dtype
  -> out [R]     fp32, sum_d x[r, d]^2

XLA reduces a row inside whatever fusion its neighbours form, with a tiling chosen for the whole
shape, so a row's sum may round differently with the number of rows in the step (a bf16 prompt's
RMSNorm did, prefilled beside 15 others against alone: benchmarks/results/README.md). Here

    program (block of `rows_per_program` rows):
      acc = 0
      for each slice of `block_d` columns (in order):   acc += sum(x[rows, slice]^2)
      out[rows] = acc

with the block and the slices static and derived from D alone, so every row is reduced by the same
program shape whatever R is and wherever it sits in its block.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plgpu

from pallas_kernels._common import pow2, sds_like
from pallas_kernels.norm.reference import check_args

MAX_BLOCK_D = 4096  # columns per slice: a row longer than this is walked in slices
VALUES_PER_PROGRAM = 8192  # rows_per_program x block_d: registers of 4 warps


def _sum_squares_kernel(x_ref, out_ref, *, num_rows, dim, rows_per_program, block_d):
    first = pl.program_id(0) * rows_per_program
    rows = pl.ds(first, rows_per_program)
    row_mask = first + jnp.arange(rows_per_program) < num_rows

    def add_slice(j, acc):
        cols = j * block_d + jnp.arange(block_d)
        mask = row_mask[:, None] & (cols < dim)[None, :]
        x = plgpu.load(x_ref.at[rows, pl.ds(j * block_d, block_d)], mask=mask, other=0)
        x = x.astype(jnp.float32)
        return acc + jnp.sum(x * x, axis=1)

    zeros = jnp.zeros((rows_per_program,), jnp.float32)
    acc = jax.lax.fori_loop(0, pl.cdiv(dim, block_d), add_slice, zeros)
    plgpu.store(out_ref.at[rows], acc, mask=row_mask)


@functools.partial(jax.jit, static_argnames=("interpret",))
def row_sum_squares(x: jax.Array, *, interpret: bool = False) -> jax.Array:
    """Pallas kernel for `row_sum_squares_reference` (same argument and result, within
    rounding), whose rounding of a row does not depend on the other rows (module docstring)."""
    check_args(x)
    num_rows, dim = x.shape
    if num_rows == 0:
        return jnp.zeros((0,), jnp.float32)
    block_d = min(pow2(dim), MAX_BLOCK_D)
    rows_per_program = max(1, VALUES_PER_PROGRAM // block_d)
    kernel = functools.partial(
        _sum_squares_kernel,
        num_rows=num_rows,
        dim=dim,
        rows_per_program=rows_per_program,
        block_d=block_d,
    )
    return pl.pallas_call(
        kernel,
        out_shape=sds_like(x, (num_rows,), jnp.float32),
        grid=(pl.cdiv(num_rows, rows_per_program),),
        compiler_params=plgpu.CompilerParams(num_warps=4, num_stages=1),
        interpret=interpret,
        name="row_sum_squares",
    )(x)
