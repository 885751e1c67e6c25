"""Plain-jnp reference of the weight-only FP8 grouped matmul, and the input checks it shares with
the kernel (shapes and semantics in `moe/fp8_grouped_matmul.py`).

Glossary: lhs [M, K] rows grouped by expert (bf16, fp16 or fp32); rhs [G, K, N] float8_e4m3fn,
group g's weights; scale [G, G_k, G_n] fp32, group g's grid of one scale per `block` = (rows
along K, columns along N) of its weights, 0 spanning the axis (`matmul/fp8_reference.py`'s
layout, one grid per group).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from pallas_kernels._common import check_shape
from pallas_kernels.matmul.fp8_reference import E4M3, Block, dequantize, scale_shape
from pallas_kernels.moe.reference import HIGHEST, check_args


def check_fp8_args(
    lhs: jax.Array,
    rhs: jax.Array,
    scale: jax.Array,
    group_sizes: jax.Array,
    block: Block,
    out_dtype,
) -> None:
    """Raise ValueError unless `check_args` holds with rhs e4m3, lhs of a 2- or 4-byte float
    dtype, block two sizes >= 0, and scale fp32 [G, *scale_shape(K, N, block)]."""
    check_args(lhs, rhs, group_sizes, out_dtype)
    if not jnp.issubdtype(lhs.dtype, jnp.floating) or lhs.dtype.itemsize < 2:
        raise ValueError(f"lhs has dtype {lhs.dtype}; expected bfloat16, float16 or float32")
    if rhs.dtype != E4M3:
        raise ValueError(f"rhs has dtype {rhs.dtype}; expected float8_e4m3fn")
    if len(block) != 2 or min(block) < 0:
        raise ValueError(f"block={block} must be two sizes >= 0 (rows along K, columns along N)")
    num_groups, k_dim, n_dim = rhs.shape
    check_shape("scale", scale, (num_groups, *scale_shape(k_dim, n_dim, block)))
    if scale.dtype != jnp.float32:
        raise ValueError(f"scale has dtype {scale.dtype}; expected float32")


def dequantize_experts(rhs: jax.Array, scale: jax.Array, block: Block) -> jax.Array:
    """rhs's fp32 values [G, K, N]: each e4m3 entry times its group's block scale."""
    return jax.vmap(functools.partial(dequantize, block=block))(rhs, scale)


@functools.partial(jax.jit, static_argnames=("block", "out_dtype"))
def fp8_grouped_matmul_reference(
    lhs: jax.Array,
    rhs: jax.Array,
    scale: jax.Array,
    group_sizes: jax.Array,
    *,
    block: Block,
    out_dtype=jnp.float32,
) -> jax.Array:
    """out[r] = lhs[r] @ dequantize(rhs[g(r)]) -> [M, N] in `out_dtype`:

    1. every group's fp32 weights, entry times block scale;
    2. XLA's ragged_dot of the fp32 rows at full precision, rounded once to `out_dtype`.
    """
    check_fp8_args(lhs, rhs, scale, group_sizes, block, out_dtype)
    weights = dequantize_experts(rhs, scale, block)  # 1.
    out = jax.lax.ragged_dot(  # 2.
        lhs.astype(jnp.float32),
        weights,
        group_sizes.astype(jnp.int32),
        precision=HIGHEST,
        preferred_element_type=jnp.float32,
    )
    return out.astype(out_dtype)
