"""`LoraFactors`: a LoRA adapter already folded into the kernel it adapts, kept for the writer."""

from __future__ import annotations

import jax.numpy as jnp
from flax import nnx


class LoraFactors(nnx.Module):
    """A rank-r adapter `x -> x down up` (down [in, r], up [r, out]; HF's `adapter.0.weight` and
    `adapter.1.weight`, transposed) whose product the loader has added to the kernel beside it
    (`jmamba.checkpoints.folding.lora_fold`). The step never reads it: it is kept so that
    `save_pretrained` can write the checkpoint's shared kernel and this adapter back
    (`jmamba.checkpoints.folding.lora_unfold`). It starts at zero, so a freshly initialised model's
    kernels hold no adapter."""

    def __init__(self, in_features: int, out_features: int, rank: int):
        self.down = nnx.Param(jnp.zeros((in_features, rank), jnp.float32))
        self.up = nnx.Param(jnp.zeros((rank, out_features), jnp.float32))
