"""Plain-jnp reference of the weight-only FP8 matmul, and the input checks it shares with the
kernel (shapes and semantics in `matmul/fp8_weights.py`).

Glossary: x [M, K] activations (bf16, fp16 or fp32); w [K, N] float8_e4m3fn entries; scale
[G_k, G_n] fp32, one per block of `block` = (rows along K, columns along N) entries, 0 spanning
the axis: per tensor (0, 0) -> [1, 1], per output channel (0, 1) -> [1, N], a checkpoint's
128 x 128 tiles (128, 128) -> [ceil(K / 128), ceil(N / 128)] (the last blocks cut short).
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp

from pallas_kernels._common import check_shape
from pallas_kernels.matmul.reference import HIGHEST

E4M3 = jnp.float8_e4m3fn
Block = tuple[int, int]


def scale_shape(k_dim: int, n_dim: int, block: Block) -> tuple[int, int]:
    """The scale grid [G_k, G_n] of a [K, N] weight in blocks of `block` (0: the whole axis)."""
    rows, cols = (
        math.ceil(n / side) if side else 1 for n, side in zip((k_dim, n_dim), block, strict=True)
    )
    return rows, cols


def check_fp8_args(x: jax.Array, w: jax.Array, scale: jax.Array, block: Block, out_dtype) -> None:
    """Raise ValueError unless x [M, K] floating, w [K, N] e4m3, block two sizes >= 0, scale
    fp32 of `scale_shape(K, N, block)`, and a floating `out_dtype`."""
    if x.ndim != 2:
        raise ValueError(f"x has shape {tuple(x.shape)}; expected [M, K]")
    if w.ndim != 2:
        raise ValueError(f"w has shape {tuple(w.shape)}; expected [K, N]")
    check_shape("w", w, (x.shape[1], None))
    if not jnp.issubdtype(x.dtype, jnp.floating) or x.dtype.itemsize < 2:
        raise ValueError(f"x has dtype {x.dtype}; expected bfloat16, float16 or float32")
    if w.dtype != E4M3:
        raise ValueError(f"w has dtype {w.dtype}; expected float8_e4m3fn")
    if len(block) != 2 or min(block) < 0:
        raise ValueError(f"block={block} must be two sizes >= 0 (rows along K, columns along N)")
    check_shape("scale", scale, scale_shape(w.shape[0], w.shape[1], block))
    if scale.dtype != jnp.float32:
        raise ValueError(f"scale has dtype {scale.dtype}; expected float32")
    if not jnp.issubdtype(out_dtype, jnp.floating):
        raise ValueError(f"out_dtype={jnp.dtype(out_dtype).name} must be a floating dtype")


def dequantize(w: jax.Array, scale: jax.Array, block: Block) -> jax.Array:
    """w's fp32 values: each e4m3 entry times its block's scale (one rounding)."""
    grid = scale
    for axis, (size, side) in enumerate(zip(w.shape, block, strict=True)):
        if side:  # 0: one scale along the axis, left to broadcast
            grid = jax.lax.slice_in_dim(jnp.repeat(grid, side, axis), 0, size, axis=axis)
    return w.astype(jnp.float32) * grid


@functools.partial(jax.jit, static_argnames=("block", "out_dtype"))
def fp8_weight_matmul_reference(
    x: jax.Array, w: jax.Array, scale: jax.Array, *, block: Block, out_dtype=jnp.bfloat16
) -> jax.Array:
    """x [M, K] @ dequantize(w, scale) [K, N] -> [M, N] in `out_dtype`:

    1. the weight's fp32 values, entry times block scale;
    2. the fp32 product at full precision, rounded once to `out_dtype`.
    """
    check_fp8_args(x, w, scale, block, out_dtype)
    weight = dequantize(w, scale, block)  # 1.
    product = jnp.dot(x.astype(jnp.float32), weight, precision=HIGHEST)  # 2.
    return product.astype(out_dtype)
