"""Grouped matmul, the routed experts of a MoE layer: rows grouped, one weight matrix per group.

Shapes (M rows, K contraction, N output columns, G groups):
  lhs:          [M, K]     rows of group g are contiguous and follow group g - 1's
  rhs:          [G, K, N]  group g's weights
  group_sizes:  [G]        rows per group (int, >= 0); rows past sum(group_sizes) belong to no group
  -> out        [M, N]     out[r] = lhs[r] @ rhs[g(r)], fp32 accumulation; 0 for rows in no group

The semantics of `jax.lax.ragged_dot(lhs, rhs, group_sizes)`. XLA:GPU (jax 0.11.2) lowers that as a
dense matmul over every group (`[M, G * K] x [G * K, N]`), reading all G weight matrices whatever
the routing. The kernel reads only the groups that have rows: program (g, N tile) finds its row
range from the prefix sums of group_sizes, returns at once for an empty group, and otherwise walks
its rows in tiles of `block_m` (masked) and K in tiles of `block_k`, so each touched group's
weights are read once per row tile. Tile sizes are static knobs (never derived from M), so a row's
arithmetic does not depend on the other rows (docs/architecture.md 5.8).
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plgpu

from pallas_kernels._common import check_tile_knobs, pow2, sds_like
from pallas_kernels.moe.reference import HIGHEST, check_args


@dataclasses.dataclass(frozen=True)
class GroupedMatmulTuning:
    """Launch knobs: a tile of `block_m` rows x `block_n` columns per step, K in `block_k` slices
    (each a power of two >= 16: tensor-core dots need 16), `num_warps`, `num_stages` (software
    pipelining of the K loop). Static: from code, never from the batch. Defaults from
    `python -m benchmarks.kernels moe --tunings all` on the H100 (Qwen3-Next experts,
    benchmarks/results/README.md): K slices of 64 in 4 stages were the fastest at 1 token (well
    ahead of 128 in 3) and tied the rest at 16-256 tokens, near the memory roofline."""

    block_m: int = 16
    block_n: int = 64
    block_k: int = 64
    num_warps: int = 4
    num_stages: int = 4

    def __post_init__(self):
        check_tile_knobs(self)


def _column_scales(scale_ref, row, cols, col_block: int):
    """[1, block_n] fp32: row `row` of a flat [G * G_k, G_n] scale grid at the columns `cols`
    (each column's block of `col_block` columns, 0: one block; clamped so that masked columns
    read a real scale)."""
    groups_n = scale_ref.shape[1]
    col_group = jnp.minimum(cols // col_block, groups_n - 1) if col_block else cols * 0
    rows = jnp.full((1, cols.shape[0]), row, jnp.int32)
    return plgpu.load(scale_ref.at[rows, col_group[None, :]])


def _grouped_matmul_kernel(
    starts_ref,
    ends_ref,
    lhs_ref,
    rhs_ref,
    *refs,
    num_rows,
    num_groups,
    k_dim,
    n_dim,
    block_m,
    block_n,
    block_k,
    compute_dtype,
    precision,
    block=None,
    groups_k=1,
):
    """Program (g, N tile): out[rows of g, tile] = lhs[rows of g] @ rhs[g, :, tile]. The extra
    program g == G zeroes the rows past the last group. With a `block` (FP8 weights, refs =
    (scale_ref, out_ref)) each product is scaled as `fp8_grouped_matmul` says: a K slice's
    partial product times its K group's scales (groups_k > 1), else the tile's sum times them."""
    scale_ref, out_ref = refs if block is not None else (None, *refs)
    g, nb = pl.program_id(0), pl.program_id(1)
    cols = nb * block_n + jnp.arange(block_n)
    col_mask = (cols < n_dim)[None, :]
    n_slice = pl.ds(nb * block_n, block_n)

    def scales(group_k):  # [1, block_n]: group g's scales in K group `group_k`
        row = g * groups_k + jnp.minimum(group_k, groups_k - 1)
        return _column_scales(scale_ref, row, cols, block[1])

    def rows_from(row0, end):
        """The row tile starting at row0 and its mask: rows in [row0, end)."""
        return pl.ds(row0, block_m), (row0 + jnp.arange(block_m) < end)[:, None]

    def tile_product(row0, end):
        """fp32 [block_m, block_n]: the tile's rows times group g's weights, over K."""
        rows, row_mask = rows_from(row0, end)

        def k_step(j, acc):
            k0 = j * block_k
            k_mask = k0 + jnp.arange(block_k) < k_dim
            a = plgpu.load(
                lhs_ref.at[rows, pl.ds(k0, block_k)], mask=row_mask & k_mask[None, :], other=0.0
            )
            b = plgpu.load(
                rhs_ref.at[g, pl.ds(k0, block_k), n_slice],
                mask=k_mask[:, None] & col_mask,
                other=0.0,
            )
            a, b = a.astype(compute_dtype), b.astype(compute_dtype)
            part = jnp.dot(a, b, precision=precision, preferred_element_type=jnp.float32)
            return acc + (part * scales(k0 // block[0]) if groups_k > 1 else part)

        zeros = jnp.zeros((block_m, block_n), jnp.float32)
        acc = jax.lax.fori_loop(0, pl.cdiv(k_dim, block_k), k_step, zeros)
        return acc * scales(0) if block is not None and groups_k == 1 else acc

    def store(row0, end, value):
        rows, row_mask = rows_from(row0, end)
        value = value.astype(out_ref.dtype)
        plgpu.store(out_ref.at[rows, n_slice], value, mask=row_mask & col_mask)

    def over_row_tiles(start, end, body):
        """body(row0) for the row tiles of [start, end); none (nothing read) when end <= start."""

        def step(i, carry):
            body(start + i * block_m)
            return carry

        jax.lax.fori_loop(0, pl.cdiv(jnp.maximum(end - start, 0), block_m), step, jnp.int32(0))

    @pl.when(g < num_groups)
    def _group():
        start, end = starts_ref[g], jnp.minimum(ends_ref[g], num_rows)
        over_row_tiles(start, end, lambda row0: store(row0, end, tile_product(row0, end)))

    @pl.when(g == num_groups)
    def _rows_in_no_group():
        start = jnp.minimum(ends_ref[num_groups - 1], num_rows)
        zeros = jnp.zeros((block_m, block_n), jnp.float32)
        over_row_tiles(start, num_rows, lambda row0: store(row0, num_rows, zeros))


@functools.partial(jax.jit, static_argnames=("out_dtype", "tuning", "interpret"))
def grouped_matmul(
    lhs: jax.Array,
    rhs: jax.Array,
    group_sizes: jax.Array,
    *,
    out_dtype=jnp.float32,
    tuning: GroupedMatmulTuning = GroupedMatmulTuning(),
    interpret: bool = False,
) -> jax.Array:
    """Pallas kernel for `grouped_matmul_reference` (same arguments and result).

    Grid (G + 1, N / block_n). Operands of different dtypes are promoted to a common one; fp32
    operands use full-precision fp32 dots. `tuning` holds the launch knobs (`GroupedMatmulTuning`);
    block_n and block_k shrink to the next power of two >= N and K (>= 16) for small matrices.
    """
    check_args(lhs, rhs, group_sizes, out_dtype)
    compute_dtype = jnp.promote_types(lhs.dtype, rhs.dtype)
    block_k = min(tuning.block_k, max(16, pow2(lhs.shape[1])))
    return launch(lhs, rhs, (), group_sizes, out_dtype, tuning, interpret, block_k, compute_dtype)


def launch(
    lhs: jax.Array,
    rhs: jax.Array,
    scales: tuple[jax.Array, ...],
    group_sizes: jax.Array,
    out_dtype,
    tuning: GroupedMatmulTuning,
    interpret: bool,
    block_k: int,
    compute_dtype,
    **scaling,
) -> jax.Array:
    """The kernel over grid (G + 1, N / block_n) for checked operands (`scales`: none, or the
    flat scale grid of FP8 weights with `scaling` = block, groups_k)."""
    num_rows = lhs.shape[0]
    num_groups, k_dim, n_dim = rhs.shape
    if num_rows == 0:
        return jnp.zeros((0, n_dim), out_dtype)
    block_n = min(tuning.block_n, max(16, pow2(n_dim)))
    sizes = group_sizes.astype(jnp.int32)
    ends = jnp.cumsum(sizes, dtype=jnp.int32)
    kernel = functools.partial(
        _grouped_matmul_kernel,
        num_rows=num_rows,
        num_groups=num_groups,
        k_dim=k_dim,
        n_dim=n_dim,
        block_m=tuning.block_m,
        block_n=block_n,
        block_k=block_k,
        compute_dtype=compute_dtype,
        precision=HIGHEST if compute_dtype == jnp.float32 else None,
        **scaling,
    )
    return pl.pallas_call(
        kernel,
        out_shape=sds_like(lhs, (num_rows, n_dim), out_dtype),
        grid=(num_groups + 1, pl.cdiv(n_dim, block_n)),
        compiler_params=plgpu.CompilerParams(
            num_warps=tuning.num_warps, num_stages=tuning.num_stages
        ),
        interpret=interpret,
        name="fp8_grouped_matmul" if scales else "grouped_matmul",
    )(ends - sizes, ends, lhs, rhs, *scales)
