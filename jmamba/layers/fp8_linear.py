"""`Fp8Linear`: a linear layer whose kernel stays in float8_e4m3fn, with its fp32 scales.

The kernel is [in, out] like `Linear`'s, each entry's value its e4m3 entry times the scale of its
block: `block` = (rows along in, columns along out) of entries sharing one scale, 0 spanning the
axis, so per-tensor scales are block (0, 0) (scale [1, 1]), per-output-channel ones (0, 1)
(scale [1, out]) and a checkpoint's 128 x 128 tiles (128, 128) (scale [ceil(in / 128),
ceil(out / 128)], the last row and column of blocks cut short).

On the GPU the product is one of three, a static choice (`GPU_PRODUCT`, or the layer's
`product`), never one that depends on the number of rows (DESIGN section 5.8):
- "weight_only": the activations stay in their dtype and the e4m3 kernel is read
  as stored, 1 byte an entry, by `pallas_kernels.ops.fp8_weight_matmul` (converted to bf16 in
  registers, fp32 accumulation, scales applied to the accumulator). At decode sizes a projection
  is memory bound, and this reads half a bf16 weight's bytes. Its tiles come from the weight's
  shape alone, so it is batch invariant.
- "weight_only_xla" (the default, the fastest measured, see `GPU_PRODUCT`): the same math left
  to XLA, `dot(x, kernel as bf16) * column scales` (its GEMM fusion converts the e4m3 operand as
  it loads it); scales blocked along `in` run "weight_only".
- "w8a8" (`fp8_product`): the activations are quantized at run time, per token (one scale a row)
  or, for block weights, per 1 x block-rows group, so each group's partial product is one FP8
  GEMM rescaled in fp32.
Inside `jmamba.layers.invariance.batch_invariant()` every FP8 layer runs "weight_only". A block
the kernel does not take (blocked along `in` by other than a multiple of 16 rows) dequantizes the
kernel and runs `matmul`. Elsewhere (CPU, interpret) the product is the reference: the dequantized
kernel through `jmamba.layers.matmul.matmul`, bit for bit the product of a `Linear` holding the
dequantized weights.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Literal

import jax
import jax.numpy as jnp
from flax import nnx

from jmamba.fp8_plan import Fp8Plan, module_at
from jmamba.layers.fp32_param import Fp32Param
from jmamba.layers.invariance import is_batch_invariant
from jmamba.layers.matmul import PRECISION, matmul
from pallas_kernels import ops
from pallas_kernels.matmul.fp8_weights import supports_block

E4M3 = jnp.float8_e4m3fn
E4M3_MAX = 448.0
Block = tuple[int, int]
Fp8Product = Literal["weight_only", "weight_only_xla", "w8a8"]
# The GPU's product (module docstring). Weight-only: on the H100 (2026-12-07, `python -m
# benchmarks.kernels fp8_linear`, the 0.87B model's projections) XLA's dot of the converted
# per-channel kernel ran 1.08-1.44x the bf16 product at M = 16-64 (0.60-0.94x at M = 1, 0.69-0.79x
# at 256), ahead of the Pallas kernel (0.17-0.99x) and W8A8 (0.10-1.1x); scales blocked along
# `in` run the kernel, ahead of XLA's dequantize-then-dot at M >= 16.
GPU_PRODUCT: Fp8Product = "weight_only_xla"


class Fp8Kernel(nnx.Param):
    """An `nnx.Param` holding e4m3 entries, which `jmamba.checkpoints.weights.cast` and
    `load_pretrained` keep in e4m3 whatever the model's dtype."""


def scale_shape(in_features: int, out_features: int, block: Block) -> tuple[int, int]:
    """The scale grid of an [in, out] kernel in blocks of `block` (0: the whole axis)."""
    sides = zip((in_features, out_features), block, strict=True)
    rows, cols = (math.ceil(n / side) if side else 1 for n, side in sides)
    return rows, cols


def _expanded(scale: jax.Array, axis: int, size: int, side: int) -> jax.Array:
    """`scale` repeated `side` times along `axis` and cut to `size` (side 0: left to broadcast)."""
    if not side:
        return scale
    return jax.lax.slice_in_dim(jnp.repeat(scale, side, axis=axis), 0, size, axis=axis)


def dequantized_kernel(kernel: jax.Array, scale: jax.Array, block: Block) -> jax.Array:
    """The kernel's fp32 values: each e4m3 entry times its block's scale, rounded once."""
    rows, cols = kernel.shape
    grid = _expanded(_expanded(scale, 0, rows, block[0]), 1, cols, block[1])
    return kernel.astype(jnp.float32) * grid


def quantize_activations(x: jax.Array, group: int) -> tuple[jax.Array, jax.Array]:
    """Rows `x` [M, K] as e4m3 [M, K] and their fp32 scales [M, G]: one scale per 1 x `group`
    entries (0: per row), amax / 448 (the smallest normal fp32 for an all-zero group, so it
    divides), entries divided by it and clipped to e4m3's range before rounding."""
    rows, k = x.shape
    group = group or k
    groups = math.ceil(k / group)
    padded = jnp.pad(x.astype(jnp.float32), ((0, 0), (0, groups * group - k)))
    padded = padded.reshape(rows, groups, group)
    amax = jnp.max(jnp.abs(padded), axis=-1)
    scale = jnp.maximum(amax / E4M3_MAX, jnp.finfo(jnp.float32).tiny)
    entries = jnp.clip(padded / scale[..., None], -E4M3_MAX, E4M3_MAX).astype(E4M3)
    return entries.reshape(rows, groups * group)[:, :k], scale


def _fp8_dot(x: jax.Array, w: jax.Array) -> jax.Array:
    """x [M, K] @ w [K, N] of e4m3 operands, accumulated and returned in fp32."""
    dims = (((1,), (0,)), ((), ()))
    return jax.lax.dot_general(x, w, dims, preferred_element_type=jnp.float32)


def fp8_product(
    x: jax.Array, kernel: jax.Array, scale: jax.Array, block: Block, out_dtype
) -> jax.Array:
    """The "w8a8" GPU product: x [..., K] @ the FP8 kernel [K, N] in `out_dtype`, the activations
    quantized per token (block rows 0) or per 1 x block-rows group, each FP8 GEMM's fp32
    accumulator times its activation and weight scales. Runs anywhere XLA has an e4m3 dot (on
    the CPU too, for tests)."""
    k, n = kernel.shape
    rows = x.reshape(-1, k)
    columns = _expanded(scale, 1, n, block[1])  # [G, N] or [G, 1]
    side = block[0]
    entries, x_scale = quantize_activations(rows, side)
    if not side:
        out = _fp8_dot(entries, kernel) * x_scale * columns
    else:
        out = jnp.zeros((rows.shape[0], n), jnp.float32)
        for g in range(x_scale.shape[1]):  # one GEMM per group: its scales differ per row
            part = slice(g * side, min((g + 1) * side, k))
            product = _fp8_dot(entries[:, part], kernel[part])
            out = out + product * x_scale[:, g : g + 1] * columns[g]
    return out.astype(out_dtype).reshape(*x.shape[:-1], n)


def reference_product(
    x: jax.Array, kernel: jax.Array, scale: jax.Array, block: Block, out_dtype
) -> jax.Array:
    """The CPU / interpret path: the dequantized kernel (cast to `out_dtype`, as a model of that
    dtype holds it) through `matmul`."""
    return matmul(x, dequantized_kernel(kernel, scale, block).astype(out_dtype), out_dtype)


def weight_only_product(
    x: jax.Array, kernel: jax.Array, scale: jax.Array, block: Block, out_dtype
) -> jax.Array:
    """The "weight_only" GPU product: x [..., K] in its dtype @ the e4m3 kernel [K, N] as stored,
    through `ops.fp8_weight_matmul` (the block must be one `supports_block` takes)."""
    k, n = kernel.shape
    rows = x.reshape(-1, k)
    out = ops.fp8_weight_matmul(rows, kernel, scale, block=block, out_dtype=out_dtype)
    return out.reshape(*x.shape[:-1], n)


def xla_weight_only_product(
    x: jax.Array, kernel: jax.Array, scale: jax.Array, block: Block, out_dtype
) -> jax.Array:
    """The "weight_only_xla" GPU product: XLA's dot of x and the kernel converted to x's dtype
    (exact; fp32 at full precision, as `matmul`), its fp32 result times the column scales; the
    reference product where the scale varies along K."""
    k, n = kernel.shape
    if scale.shape[0] > 1:
        return reference_product(x, kernel, scale, block, out_dtype)
    w = kernel.astype(x.dtype)
    product = jnp.dot(x, w, preferred_element_type=jnp.float32, precision=PRECISION)
    return (product * _expanded(scale, 1, n, block[1])[0]).astype(out_dtype)


PRODUCTS: dict[str, Callable[..., jax.Array]] = {
    "weight_only": weight_only_product,
    "weight_only_xla": xla_weight_only_product,
    "w8a8": fp8_product,
}


def gpu_product(choice: Fp8Product, in_features: int, block: Block) -> Callable[..., jax.Array]:
    """The GPU's product for a kernel of `in_features` rows in `block`s (module docstring): the
    weight-only kernel under `batch_invariant()`, the dequantizing reference where the kernel
    does not take the block. Static: nothing here sees the rows."""
    if choice not in PRODUCTS:
        raise ValueError(f"product={choice!r} must be one of {tuple(PRODUCTS)}")
    if is_batch_invariant() or (
        choice == "weight_only_xla" and _blocked_along_k(in_features, block)
    ):
        choice = "weight_only"
    if choice == "weight_only" and not supports_block(in_features, block):
        return reference_product
    return PRODUCTS[choice]


def _blocked_along_k(in_features: int, block: Block) -> bool:
    """Whether the scale changes along the kernel's rows (XLA's dot cannot apply it after)."""
    return bool(block[0]) and in_features > block[0]


class Fp8Linear(nnx.Module):
    """`x @ kernel` with an e4m3 kernel [in_features, out_features] and fp32 `scale` (see the
    module docstring for `block`), emitted in x's dtype (the model's stream dtype: a `Linear`
    of the dequantized kernel in that dtype gives the same product on the CPU).

    `product` picks the GPU's product (None: `GPU_PRODUCT`, read when the layer is called). Built
    empty (zero entries, unit scales): its values come from a checkpoint
    (`jmamba.checkpoints.quantization.fp8_params`)."""

    def __init__(
        self, in_features: int, out_features: int, block: Block, product: Fp8Product | None = None
    ):
        self.block = block
        self.product = product
        self.kernel = Fp8Kernel(jnp.zeros((in_features, out_features), E4M3))
        self.scale = Fp32Param(jnp.ones(scale_shape(in_features, out_features, block)))

    def __call__(self, x: jax.Array) -> jax.Array:
        kernel = self.kernel[...]
        if jax.default_backend() == "gpu":
            product = gpu_product(self.product or GPU_PRODUCT, kernel.shape[0], self.block)
        else:
            product = reference_product
        return product(x, kernel, self.scale[...], self.block, x.dtype)


def with_fp8_linears(model: nnx.Module, plan: Fp8Plan) -> None:
    """Replace each `Linear` at one of the plan's module paths under `model` by an `Fp8Linear`
    of its shape (the factory of the planned layers: the modules that build them build plain
    `Linear`s and call them the same way). A path under a part the model was built without is
    passed over: `HybridLM.without_head`'s config drops the MTP head but keeps its plan."""
    for path, block in plan.layers:
        parent = module_at(model, path[:-1])
        if parent is not None:
            in_features, out_features = getattr(parent, str(path[-1])).kernel.shape
            setattr(parent, str(path[-1]), Fp8Linear(in_features, out_features, block))
