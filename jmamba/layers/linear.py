"""A bias-free linear layer storing its kernel as [in, out] (HF stores [out, in]).

Its product is `jmamba.layers.matmul.matmul`, the model's one matmul (fp32 at full precision,
batch invariant when asked).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from jmamba.layers.matmul import matmul


class Linear(nnx.Module):
    """`x @ kernel` with kernel [in_features, out_features], emitted in the kernel's dtype.

    A bf16 kernel gives a bf16 product straight from the GEMM (which accumulates in fp32), so no
    convert follows it; an fp32 kernel computes in full fp32. `param` is the kernel's variable
    type: `Fp32Param` for a kernel that stays fp32 in a bf16 model (the MoE router).
    """

    def __init__(
        self,
        in_features: int,
        out_features: int,
        *,
        rngs: nnx.Rngs,
        scale: float = 1.0,
        param: type[nnx.Param] = nnx.Param,
    ):
        std = scale / in_features**0.5
        init = jax.random.normal(rngs.params(), (in_features, out_features), jnp.float32) * std
        self.kernel = param(init)

    def __call__(self, x: jax.Array) -> jax.Array:
        kernel = self.kernel[...]
        return matmul(x, kernel, kernel.dtype)
