"""A loaded model's parameters with each `Fp8Linear`'s e4m3 kernel and scales (and each FP8
expert stack and its scales) as the one kernel they stand for: what the dequantizing load
(milestone 1) gives for that layer."""

from __future__ import annotations

from pathlib import Path

import jax.numpy as jnp
import numpy as np
from flax import nnx

from jmamba.checkpoints.shards import read_shards
from jmamba.layers.fp8_experts import EXPERT_STACKS, dequantized_experts
from jmamba.layers.fp8_linear import dequantized_kernel
from jmamba.loading import load_model_shapes
from jmamba.model import HybridLM
from jmamba.sharding import shard_config


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


def dequantized_shards(model_dir: Path, shards: int) -> dict[tuple, list[np.ndarray]]:
    """`read_shards(model_dir, shards)`, each e4m3 kernel's shards dequantized with its scale's
    shards (in the scales' fp32; the shard config's plan gives the blocks), the scales left
    out."""
    cfg = shard_config(load_model_shapes(model_dir)[0].config, shards)
    blocks = {(*path, "kernel"): block for path, block in cfg.quantization.layers}
    values = dict(read_shards(model_dir, shards))
    out = {}
    for path, parts in values.items():
        if path[-1] == "scale":
            continue
        if path in blocks:
            scales = values[(*path[:-1], "scale")]
            assert parts[0].dtype == jnp.float8_e4m3fn
            pairs = zip(parts, scales, strict=True)
            parts = [np.asarray(dequantized_kernel(k, s, blocks[path])) for k, s in pairs]
        out[path] = parts
    return out
