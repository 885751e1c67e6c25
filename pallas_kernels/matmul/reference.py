"""Plain-jnp reference of the dense matmul, and the input checks it shares with the kernel
(shapes and semantics in `matmul/fixed_tiles.py`).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from pallas_kernels._common import check_shape

HIGHEST = jax.lax.Precision.HIGHEST  # fp32 operands: IEEE fp32 dots, not TF32


def check_args(x: jax.Array, w: jax.Array, out_dtype) -> None:
    """Raise ValueError unless x [M, K], w [K, N] of one dtype, and a floating `out_dtype`."""
    if x.ndim != 2:
        raise ValueError(f"x has shape {tuple(x.shape)}; expected [M, K]")
    if w.ndim != 2:
        raise ValueError(f"w has shape {tuple(w.shape)}; expected [K, N]")
    check_shape("w", w, (x.shape[1], None))
    if x.dtype != w.dtype:
        raise ValueError(f"x has dtype {x.dtype} and w {w.dtype}; expected one dtype")
    if not jnp.issubdtype(out_dtype, jnp.floating):
        raise ValueError(f"out_dtype={jnp.dtype(out_dtype).name} must be a floating dtype")


@functools.partial(jax.jit, static_argnames=("out_dtype",))
def matmul_reference(x: jax.Array, w: jax.Array, *, out_dtype=jnp.float32) -> jax.Array:
    """x [M, K] @ w [K, N] -> [M, N] in `out_dtype`: XLA's dot, fp32 accumulation (fp32
    operands at full precision). How it rounds a row may depend on M (XLA picks the GEMM)."""
    check_args(x, w, out_dtype)
    return jnp.dot(x, w, preferred_element_type=out_dtype, precision=HIGHEST)
