"""FP8 expert stacks: a MoE layer whose routed experts' weights stay in float8_e4m3fn, with fp32
scales, half the bytes of bf16 stacks (an 80B FP8 MoE is mostly experts).

Each stack `gate_proj` / `up_proj` / `down_proj` [E, in, out] (as the MoE's own) becomes an
`Fp8Kernel` of e4m3 entries, beside `<proj>_scale` [E, G_in, G_out] fp32: expert e's grid of one
scale per `block` = (rows along in, columns along out) of its kernel, 0 spanning the axis (the
layout of `Fp8Linear`, one grid per expert). On the GPU the grouped product reads the stacks as
stored (`ops.fp8_grouped_matmul`, weight-only: rows in their dtype, scales on the fp32
accumulator); a block the kernel does not take, and the CPU, run the reference: the stack
dequantized and cast to the rows' dtype (as a model of that dtype holds the dequantized stack)
through `ops.grouped_matmul`, bit for bit the MoE holding the dequantized weights.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from jmamba.fp8_plan import Block, Fp8Plan, module_at
from jmamba.layers.fp8_linear import E4M3, Fp8Kernel, dequantized_kernel, scale_shape
from jmamba.layers.fp32_param import Fp32Param
from pallas_kernels import ops
from pallas_kernels.moe.fp8_grouped_matmul import supports_block

EXPERT_STACKS = ("gate_proj", "up_proj", "down_proj")  # the MoE's stacks (gate_proj if gated)


def dequantized_experts(kernel: jax.Array, scale: jax.Array, block: Block) -> jax.Array:
    """A stack's fp32 values [E, in, out]: each e4m3 entry times its expert's block scale."""
    return jax.vmap(lambda k, s: dequantized_kernel(k, s, block))(kernel, scale)


def fp8_expert_product(
    rows: jax.Array, kernel: jax.Array, scale: jax.Array, group_sizes: jax.Array, block: Block
) -> jax.Array:
    """rows [M, in] grouped by expert (`group_sizes`) times the FP8 stack [E, in, out], fp32
    [M, out] (the module docstring says which product runs where)."""
    if jax.default_backend() == "gpu" and supports_block(kernel.shape[1], block):
        return ops.fp8_grouped_matmul(
            rows, kernel, scale, group_sizes, block=block, out_dtype=jnp.float32
        )
    weights = dequantized_experts(kernel, scale, block).astype(rows.dtype)
    return ops.grouped_matmul(rows, weights, group_sizes, out_dtype=jnp.float32)


def with_fp8_experts(model, plan: Fp8Plan) -> None:
    """Make each MoE at one of the plan's `experts` paths hold its stacks in e4m3 (`fp8_block`,
    the stacks as `Fp8Kernel`s and their `<proj>_scale`s, built empty: zero entries, unit
    scales; the loader fills them). A path under a part the model was built without is passed
    over, as `with_fp8_linears`."""
    for path, block in plan.experts:
        moe = module_at(model, path)
        if moe is None:
            continue
        moe.fp8_block = block
        for proj in (p for p in EXPERT_STACKS if hasattr(moe, p)):
            experts, in_features, out_features = getattr(moe, proj).get_value().shape
            setattr(moe, proj, Fp8Kernel(jnp.zeros((experts, in_features, out_features), E4M3)))
            grid = (experts, *scale_shape(in_features, out_features, block))
            setattr(moe, f"{proj}_scale", Fp32Param(jnp.ones(grid, jnp.float32)))
