"""Grid points of the fixed-tile matmul: the product against a full-precision einsum, and each
probed row's bitwise independence from the other rows.

The grid's cases judge an output and a state pool. This op has no pool, so its case carries a
two-slot tally in the pool's place (slot 0 NaN, as every pool's NULL slot): the kernel writes to
slot 1 the number of outputs of the probed rows that differ bitwise between the product of all
rows and the product of each row alone (M = 1) or of its first rows only; the reference writes 0.
Any difference fails the state comparison.
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np

from benchmarks.checks.kernels.case import F32, TOLERANCE, Case, Shape
from benchmarks.checks.kernels.layouts import normal, random_pool
from pallas_kernels.matmul import fixed_tiles


def _bit_differences(x, w, out, out_dtype, interpret: bool) -> jnp.ndarray:
    """Outputs of rows 0, M // 2 and M - 1 that differ between `out` (all M rows) and the row
    computed alone; and of rows 0..2 between `out` and the product of the first three rows."""
    count = jnp.zeros((), jnp.int32)
    m = x.shape[0]
    for r in sorted({0, m // 2, m - 1}):
        alone = fixed_tiles.matmul(x[r : r + 1], w, out_dtype=out_dtype, interpret=interpret)
        count += jnp.sum(alone[0] != out[r])
    first = fixed_tiles.matmul(x[:3], w, out_dtype=out_dtype, interpret=interpret)
    return count + jnp.sum(first != out[:3])


def matmul(m: int, k: int, n: int, dtype, out_dtype=F32) -> Shape:
    """x [m, k] @ w [k, n]; the tile and split plan as the model gets it (`plan`)."""

    def build(rng) -> Case:
        x = normal(rng, (m, k), dtype)
        w = normal(rng, (k, n), dtype, k**-0.5)
        tally = random_pool(rng, 2, (1,), F32)

        def kernel(x, w, tally, *, interpret):
            out = fixed_tiles.matmul(x, w, out_dtype=out_dtype, interpret=interpret)
            differ = _bit_differences(x, w, out, out_dtype, interpret)
            return out, tally.at[1, 0].set(differ.astype(F32))

        def reference(x, w, tally):
            out = jnp.einsum("mk,kn->mn", x.astype(F32), w.astype(F32), precision="highest")
            return out.astype(out_dtype), tally.at[1, 0].set(0.0)

        splits = fixed_tiles.plan(k, n, fixed_tiles.MatmulTuning()).num_splits
        tol = TOLERANCE[F32 if out_dtype == F32 else dtype, "update"]
        live = np.ones((m, 1), bool)
        layout = f"M={m} K split in {splits}"
        return Case(kernel, reference, (x, w, tally), 2, live, np.array([1], np.int32), tol, layout)

    dtypes = f"{jnp.dtype(dtype).name} -> {jnp.dtype(out_dtype).name}"
    return Shape(f"matmul M={m} K={k} N={n} {dtypes}", build)
