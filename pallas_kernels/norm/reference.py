"""Plain-jnp reference of the rows' sums of squares, and the input checks it shares with the
kernel (shapes and semantics in `norm/sum_squares.py`).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp


def check_args(x: jax.Array) -> None:
    """Raise ValueError unless x is [R, D] and floating."""
    if x.ndim != 2:
        raise ValueError(f"x has shape {tuple(x.shape)}; expected [R, D]")
    if not jnp.issubdtype(x.dtype, jnp.floating):
        raise ValueError(f"x has dtype {x.dtype}; expected a floating dtype")


@jax.jit
def row_sum_squares_reference(x: jax.Array) -> jax.Array:
    """x [R, D] -> [R] fp32: sum over D of x^2, computed in fp32. XLA's reduction: how it orders
    a row's sum may depend on R and on what it fuses the reduction with."""
    check_args(x)
    x = x.astype(jnp.float32)
    return jnp.sum(x * x, axis=-1)
