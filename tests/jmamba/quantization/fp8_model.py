"""A loaded model's parameters with each `Fp8Linear`'s e4m3 kernel and scales as the one kernel
they stand for: what the dequantizing load (milestone 1) gives for that layer."""

from __future__ import annotations

import numpy as np
from flax import nnx

from jmamba.layers.fp8_linear import dequantized_kernel
from jmamba.model import HybridLM


def dequantized_params(model: HybridLM) -> dict[tuple, np.ndarray]:
    """Every parameter by path; an FP8 layer's `kernel` dequantized and cast to the model's
    dtype, its `scale` left out."""
    flat = {p: v.get_value() for p, v in nnx.to_flat_state(nnx.state(model))}
    blocks = {(*path, "kernel"): block for path, block in model.config.quantization.layers}
    out = {}
    for path, value in flat.items():
        if path[:-1] in {p[:-1] for p in blocks} and path[-1] == "scale":
            continue
        if path in blocks:
            scale = flat[(*path[:-1], "scale")]
            value = dequantized_kernel(value, scale, blocks[path]).astype(model.dtype)
        out[path] = np.asarray(value)
    return out
