"""A loaded model's parameters with each `Fp8Linear`'s e4m3 kernel and scales (and each FP8
expert stack and its scales) as the one kernel they stand for: what the dequantizing load
(milestone 1) gives for that layer."""

from __future__ import annotations

import numpy as np
from flax import nnx

from jmamba.layers.fp8_experts import EXPERT_STACKS, dequantized_experts
from jmamba.layers.fp8_linear import dequantized_kernel
from jmamba.model import HybridLM


def dequantized_params(model: HybridLM) -> dict[tuple, np.ndarray]:
    """Every parameter by path; an FP8 layer's `kernel` dequantized and cast to the model's
    dtype, its `scale` left out."""
    flat = {p: v.get_value() for p, v in nnx.to_flat_state(nnx.state(model))}
    plan = model.config.quantization
    kernels = {(*path, "kernel"): (*path, "scale") for path, _ in plan.layers}
    kernels |= {(*p, s): (*p, f"{s}_scale") for p, _ in plan.experts for s in EXPERT_STACKS}
    blocks = {(*path, "kernel"): block for path, block in plan.layers}
    blocks |= {(*p, s): block for p, block in plan.experts for s in EXPERT_STACKS}
    out = {}
    for path, value in flat.items():
        if path in kernels.values():
            continue
        if path in kernels:
            scale = flat[kernels[path]]
            dequantize = dequantized_kernel if value.ndim == 2 else dequantized_experts
            value = dequantize(value, scale, blocks[path]).astype(model.dtype)
        out[path] = np.asarray(value)
    return out
