"""`matmul`: the one product every projection of the model runs (the layers' `Linear`s and the LM
head).

XLA's GEMM picks its algorithm by the whole shape: on the GPU a one-row product runs a
matrix-vector kernel and larger ones tiled GEMMs, so a row's bf16 outputs round differently with
how many rows share the product (40% of a row's outputs at the 0.87B model's shapes,
benchmarks/results/README.md). Under `jmamba.layers.invariance.batch_invariant()` every
product runs `pallas_kernels.ops.matmul` instead, whose tiles and split of K come from the
weight's shape alone, at some cost in speed at prefill sizes (benchmarks/kernels/matmul.py).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from jmamba.layers.invariance import is_batch_invariant
from pallas_kernels import ops

PRECISION = jax.lax.Precision.HIGHEST


def matmul(x: jax.Array, w: jax.Array, out_dtype) -> jax.Array:
    """x [..., K] @ w [K, N] -> [..., N] in `out_dtype`, fp32 accumulation; fp32 operands at full
    precision (XLA would otherwise use TF32 on the GPU, which flips near-tied MoE routing
    decisions). `x` is cast to w's dtype first."""
    x = x.astype(w.dtype)
    if not is_batch_invariant():
        return jnp.dot(x, w, preferred_element_type=out_dtype, precision=PRECISION)
    rows = x.reshape(-1, x.shape[-1])
    return ops.matmul(rows, w, out_dtype=out_dtype).reshape(*x.shape[:-1], w.shape[-1])
