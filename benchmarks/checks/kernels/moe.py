"""Grid points of the MoE grouped matmul kernels (bf16 / fp32 weights, and e4m3 weights with
block scales), against an oracle that uses no ragged_dot."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np

from benchmarks.checks.kernels.case import F32, TOLERANCE, Case, Shape
from benchmarks.checks.kernels.layouts import normal, random_pool
from pallas_kernels.matmul.fp8_reference import scale_shape
from pallas_kernels.moe import fp8_grouped_matmul as fp8_gmm
from pallas_kernels.moe import grouped_matmul as gmm
from pallas_kernels.moe.fp8_reference import dequantize_experts

BLOCK_NAMES = {(0, 0): "per tensor", (0, 1): "per channel", (128, 128): "128x128 blocks"}


def _grouped_matmul_oracle(lhs, rhs, group_sizes, out_dtype):
    """Every row times every group's weights ([G, M, N], fp32 at full precision), then each row
    picks its own group's product: no ragged_dot, and empty groups' NaN weights reach no row."""
    ends = jnp.cumsum(group_sizes)
    row = jnp.arange(lhs.shape[0])
    group = jnp.minimum(jnp.searchsorted(ends, row, side="right"), rhs.shape[0] - 1)
    every = jnp.einsum("mk,gkn->gmn", lhs.astype(F32), rhs.astype(F32), precision="highest")
    return jnp.where((row < ends[-1])[:, None], every[group, row], 0.0).astype(out_dtype)


def _rows(rng, k: int, groups: int, dtype) -> tuple[np.ndarray, np.ndarray]:
    """(lhs, group_sizes): groups of 0 to 19 rows (about 40% empty, group 0 among them), one
    group of 37 rows (several row tiles), 5 rows in no group (NaN: never read, output 0)."""
    sizes = rng.integers(0, 20, groups).astype(np.int32)
    sizes[rng.random(groups) < 0.4] = 0
    sizes[0], sizes[-1] = 0, 37
    lhs = np.array(normal(rng, (int(sizes.sum()) + 5, k), dtype, k**-0.5))
    lhs[-5:] = np.nan
    return lhs, sizes


def grouped_matmul(k: int, n: int, groups: int, dtype, out_dtype=F32) -> Shape:
    """MoE experts (rows as `_rows`). Group 0 is empty and its weights are NaN (the pool's NULL
    slot): an empty group's weights are never read. Needs groups >= 2."""

    def build(rng) -> Case:
        lhs, sizes = _rows(rng, k, groups, dtype)
        num_rows = lhs.shape[0]
        args = (lhs, random_pool(rng, groups, (k, n), dtype), sizes)

        def kernel(*a, interpret):
            return gmm.grouped_matmul(*a, out_dtype=out_dtype, interpret=interpret), a[1]

        def reference(*a):
            return _grouped_matmul_oracle(*a, out_dtype), a[1]

        live = (np.arange(num_rows) < sizes.sum())[:, None]
        tol = TOLERANCE[out_dtype, "update"]  # bf16 products are exact in fp32
        return Case(
            kernel,
            reference,
            args,
            1,
            live,
            np.zeros(0, np.int32),
            tol,
            f"M={num_rows} groups with rows={int(np.sum(sizes > 0))}",
        )

    dtypes = f"{jnp.dtype(dtype).name} -> {jnp.dtype(out_dtype).name}"
    return Shape(f"grouped_matmul K={k} N={n} G={groups} {dtypes}", build)


def fp8_grouped_matmul(k: int, n: int, groups: int, block, dtype, out_dtype=F32) -> Shape:
    """FP8 experts (rows as `_rows`): e4m3 weights with fp32 scales per `block`, group 0's
    weights NaN (never read), against the oracle of the dequantized weights. Needs groups >= 2."""

    def build(rng) -> Case:
        lhs, sizes = _rows(rng, k, groups, dtype)
        weights = normal(rng, (groups, k, n), F32, 100.0).clip(-448, 448)
        weights[0] = np.nan
        rhs = np.asarray(jnp.asarray(weights, jnp.float8_e4m3fn))
        scale = rng.uniform(1e-3, 1e-2, (groups, *scale_shape(k, n, block))).astype(np.float32)

        def kernel(lhs, rhs, scale, sizes, *, interpret):
            out = fp8_gmm.fp8_grouped_matmul(
                lhs, rhs, scale, sizes, block=block, out_dtype=out_dtype, interpret=interpret
            )
            return out, rhs

        def reference(lhs, rhs, scale, sizes):
            weights = dequantize_experts(rhs, scale, block)
            return _grouped_matmul_oracle(lhs, weights, sizes, out_dtype), rhs

        live = (np.arange(lhs.shape[0]) < sizes.sum())[:, None]
        tol = TOLERANCE[F32 if out_dtype == F32 else dtype, "update"]
        layout = f"M={lhs.shape[0]} groups with rows={int(np.sum(sizes > 0))}"
        args = (lhs, rhs, scale, sizes)
        return Case(kernel, reference, args, 1, live, np.zeros(0, np.int32), tol, layout)

    dtypes = f"{jnp.dtype(dtype).name} -> {jnp.dtype(out_dtype).name}"
    blocks = BLOCK_NAMES.get(block, block)
    return Shape(f"fp8_grouped_matmul K={k} N={n} G={groups} {blocks} {dtypes}", build)
