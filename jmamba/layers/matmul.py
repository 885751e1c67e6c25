"""`matmul`: the one product every projection of the model runs, and the switch that makes it
batch invariant.

XLA's GEMM picks its algorithm by the whole shape: on the GPU a one-row product runs a
matrix-vector kernel and larger ones tiled GEMMs, so a row's bf16 outputs round differently with
how many rows share the product (40% of a row's outputs at the 0.87B model's shapes,
benchmarks/RESULTS.md, 2026-11-26). A step at B = 1 and the same request's step beside others, or
with 1 + K speculative lanes, then break near-ties of the greedy argmax differently.

Inside `batch_invariant_matmuls()` every product runs `pallas_kernels.ops.matmul` instead, whose
tiles and split of K come from the weight's shape alone: a row's outputs are bitwise the same
whatever else the step holds, at some cost in speed (benchmarks/bench_matmul.py). The switch is
read when a step is traced, so it is part of what a compiled step is specialised on
(`EngineConfig.batch_invariant`). On the CPU the op runs its reference either way.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator

import jax
import jax.numpy as jnp

from pallas_kernels import ops

PRECISION = jax.lax.Precision.HIGHEST

_BATCH_INVARIANT = contextvars.ContextVar("batch_invariant_matmuls", default=False)


@contextlib.contextmanager
def batch_invariant_matmuls(on: bool = True) -> Iterator[None]:
    """Products traced inside run the fixed-tile kernel when `on` (module docstring)."""
    token = _BATCH_INVARIANT.set(on)
    try:
        yield
    finally:
        _BATCH_INVARIANT.reset(token)


def matmul(x: jax.Array, w: jax.Array, out_dtype) -> jax.Array:
    """x [..., K] @ w [K, N] -> [..., N] in `out_dtype`, fp32 accumulation; fp32 operands at full
    precision (XLA would otherwise use TF32 on the GPU, which flips near-tied MoE routing
    decisions). `x` is cast to w's dtype first."""
    x = x.astype(w.dtype)
    if not _BATCH_INVARIANT.get():
        return jnp.dot(x, w, preferred_element_type=out_dtype, precision=PRECISION)
    rows = x.reshape(-1, x.shape[-1])
    return ops.matmul(rows, w, out_dtype=out_dtype).reshape(*x.shape[:-1], w.shape[-1])
