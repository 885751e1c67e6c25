"""Plain-jnp reference of the MoE grouped matmul, and the input checks it shares with the kernel
(shapes and semantics in `moe/grouped_matmul.py`).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from pallas_kernels._common import check_shape

HIGHEST = jax.lax.Precision.HIGHEST  # fp32 operands: IEEE fp32 dots, not TF32


def check_args(lhs: jax.Array, rhs: jax.Array, group_sizes: jax.Array, out_dtype) -> None:
    """Raise ValueError unless lhs [M, K], rhs [G, K, N], group_sizes [G] (integer), float out."""
    if lhs.ndim != 2:
        raise ValueError(f"lhs has shape {tuple(lhs.shape)}; expected [M, K]")
    if rhs.ndim != 3 or rhs.shape[0] < 1:
        raise ValueError(f"rhs has shape {tuple(rhs.shape)}; expected [G >= 1, K, N]")
    check_shape("rhs", rhs, (None, lhs.shape[1], None))
    check_shape("group_sizes", group_sizes, (rhs.shape[0],))
    if not jnp.issubdtype(group_sizes.dtype, jnp.integer):
        raise ValueError(f"group_sizes has dtype {group_sizes.dtype}; expected an integer dtype")
    if not jnp.issubdtype(out_dtype, jnp.floating):
        raise ValueError(f"out_dtype={jnp.dtype(out_dtype).name} must be a floating dtype")


@functools.partial(jax.jit, static_argnames=("out_dtype",))
def grouped_matmul_reference(
    lhs: jax.Array, rhs: jax.Array, group_sizes: jax.Array, *, out_dtype=jnp.float32
) -> jax.Array:
    """lhs [M, K], rhs [G, K, N], group_sizes [G] -> out [M, N] in `out_dtype`.

    XLA's `jax.lax.ragged_dot` (fp32 accumulation, fp32 operands at full precision). Fine on the
    CPU; on the GPU its dense lowering reads every group's weights (use the kernel there).
    """
    check_args(lhs, rhs, group_sizes, out_dtype)
    out = jax.lax.ragged_dot(
        lhs,
        rhs,
        group_sizes.astype(jnp.int32),
        precision=HIGHEST,
        preferred_element_type=jnp.float32,
    )
    return out.astype(out_dtype)
