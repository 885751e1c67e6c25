"""Grid points of the weight-only FP8 matmul: the product against a full-precision einsum of the
dequantized weight, and each probed row's bitwise independence from the other rows.

As for the fixed-tile matmul (`kernels/matmul.py`), the case carries a two-slot tally in the
pool's place (slot 0 NaN): the kernel writes to slot 1 the number of outputs of rows 0, M // 2
and M - 1 that differ bitwise between the product of all rows and of each row alone, and of rows
0..2 between it and the product of the first three rows; the reference writes 0.
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np

from benchmarks.checks.kernels.case import F32, TOLERANCE, Case, Shape
from benchmarks.checks.kernels.layouts import normal, random_pool
from pallas_kernels.matmul import fp8_weights
from pallas_kernels.matmul.fp8_reference import dequantize, scale_shape

BLOCK_NAMES = {(0, 0): "per tensor", (0, 1): "per channel", (128, 128): "128x128 blocks"}


def _bit_differences(x, w, scale, out, block, out_dtype, interpret: bool) -> jnp.ndarray:
    def product(rows):
        return fp8_weights.fp8_weight_matmul(
            rows, w, scale, block=block, out_dtype=out_dtype, interpret=interpret
        )

    count = jnp.zeros((), jnp.int32)
    m = x.shape[0]
    for r in sorted({0, m // 2, m - 1}):
        count += jnp.sum(product(x[r : r + 1])[0] != out[r])
    return count + jnp.sum(product(x[:3]) != out[:3])


def fp8_weight_matmul(m: int, k: int, n: int, block, dtype, out_dtype=F32) -> Shape:
    """x [m, k] (dtype) @ e4m3 w [k, n] with scales per `block`; the plan as the model gets it."""

    def build(rng) -> Case:
        x = normal(rng, (m, k), dtype)
        w = np.asarray(
            jnp.asarray(normal(rng, (k, n), F32, 100.0).clip(-448, 448), jnp.float8_e4m3fn)
        )
        scale = rng.uniform(1e-3, 1e-2, scale_shape(k, n, block)).astype(np.float32)
        tally = random_pool(rng, 2, (1,), F32)

        def kernel(x, w, scale, tally, *, interpret):
            out = fp8_weights.fp8_weight_matmul(
                x, w, scale, block=block, out_dtype=out_dtype, interpret=interpret
            )
            differ = _bit_differences(x, w, scale, out, block, out_dtype, interpret)
            return out, tally.at[1, 0].set(differ.astype(F32))

        def reference(x, w, scale, tally):
            weight = dequantize(w, scale, block)
            out = jnp.einsum("mk,kn->mn", x.astype(F32), weight, precision="highest")
            return out.astype(out_dtype), tally.at[1, 0].set(0.0)

        plan = fp8_weights.fp8_plan(k, n, block, fp8_weights.FP8_TUNING)
        tol = TOLERANCE[F32 if out_dtype == F32 else dtype, "update"]
        live = np.ones((m, 1), bool)
        layout = f"M={m} K split in {plan.num_splits}, slices of {plan.block_k}"
        args = (x, w, scale, tally)
        return Case(kernel, reference, args, 3, live, np.array([1], np.int32), tol, layout)

    dtypes = f"{jnp.dtype(dtype).name} -> {jnp.dtype(out_dtype).name}"
    name = f"fp8_weight_matmul M={m} K={k} N={n} {BLOCK_NAMES.get(block, block)} {dtypes}"
    return Shape(name, build)
