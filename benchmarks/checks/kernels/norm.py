"""Grid points of the norms' row statistics (`row_sum_squares`): against a full-precision sum, and
each probed row's bitwise independence from the other rows (the tally of `kernels/matmul.py`)."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np

from benchmarks.checks.kernels.case import F32, TOLERANCE, Case, Shape
from benchmarks.checks.kernels.layouts import normal, random_pool
from pallas_kernels.norm import sum_squares


def _bit_differences(x, out, interpret: bool) -> jnp.ndarray:
    """Rows 0, R // 2 and R - 1 alone, and the first three rows together, against `out`."""
    count = jnp.zeros((), jnp.int32)
    for r in sorted({0, x.shape[0] // 2, x.shape[0] - 1}):
        alone = sum_squares.row_sum_squares(x[r : r + 1], interpret=interpret)
        count += jnp.sum(alone[0] != out[r])
    first = sum_squares.row_sum_squares(x[:3], interpret=interpret)
    return count + jnp.sum(first != out[:3])


def row_sum_squares(rows: int, dim: int, dtype) -> Shape:
    """x [rows, dim] -> the sum of squares of each row."""

    def build(rng) -> Case:
        x = normal(rng, (rows, dim), dtype)
        tally = random_pool(rng, 2, (1,), F32)

        def kernel(x, tally, *, interpret):
            out = sum_squares.row_sum_squares(x, interpret=interpret)
            differ = _bit_differences(x, out, interpret)
            return out, tally.at[1, 0].set(differ.astype(F32))

        def reference(x, tally):
            x = x.astype(F32)
            return jnp.sum(x * x, axis=-1), tally.at[1, 0].set(0.0)

        live = np.ones(rows, bool)
        return Case(
            kernel,
            reference,
            (x, tally),
            1,
            live,
            np.array([1], np.int32),
            TOLERANCE[F32, "update"],
            f"R={rows}",
        )

    return Shape(f"row_sum_squares R={rows} D={dim} {jnp.dtype(dtype).name}", build)
