"""Grid points of the MoE grouped matmul kernel, against an oracle that uses no ragged_dot."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np

from benchmarks.checks.kernels.case import F32, TOLERANCE, Case, Shape
from benchmarks.checks.kernels.layouts import normal, random_pool
from pallas_kernels.moe import grouped_matmul as gmm


def _grouped_matmul_oracle(lhs, rhs, group_sizes, out_dtype):
    """Every row times every group's weights ([G, M, N], fp32 at full precision), then each row
    picks its own group's product: no ragged_dot, and empty groups' NaN weights reach no row."""
    ends = jnp.cumsum(group_sizes)
    row = jnp.arange(lhs.shape[0])
    group = jnp.minimum(jnp.searchsorted(ends, row, side="right"), rhs.shape[0] - 1)
    every = jnp.einsum("mk,gkn->gmn", lhs.astype(F32), rhs.astype(F32), precision="highest")
    return jnp.where((row < ends[-1])[:, None], every[group, row], 0.0).astype(out_dtype)


def grouped_matmul(k: int, n: int, groups: int, dtype, out_dtype=F32) -> Shape:
    """MoE experts: groups of 0 to 19 rows (about 40% empty), one group of 37 rows (several row
    tiles), 5 rows in no group (NaN: never read, output 0). Group 0 is empty and its weights are
    NaN (the pool's NULL slot): an empty group's weights are never read. Needs groups >= 2."""

    def build(rng) -> Case:
        sizes = rng.integers(0, 20, groups).astype(np.int32)
        sizes[rng.random(groups) < 0.4] = 0
        sizes[0], sizes[-1] = 0, 37
        num_rows = int(sizes.sum()) + 5
        lhs = np.array(normal(rng, (num_rows, k), dtype, k**-0.5))
        lhs[-5:] = np.nan
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
