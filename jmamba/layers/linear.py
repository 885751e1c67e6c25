"""A bias-free linear layer storing its kernel as [in, out] (HF stores [out, in]).

`PRECISION` is used by every matmul of the model library: an fp32 model computes in fp32 (XLA would
otherwise use TF32 on the GPU, which flips near-tied MoE routing decisions); bf16 operands are
unaffected.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

PRECISION = jax.lax.Precision.HIGHEST


class Linear(nnx.Module):
    """`x @ kernel` with kernel [in_features, out_features], emitted in the kernel's dtype.

    A bf16 kernel gives a bf16 product straight from the GEMM (which accumulates in fp32), so no
    convert follows it; an fp32 kernel computes at `PRECISION`. `param` is the kernel's variable
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
        return jnp.dot(
            x.astype(kernel.dtype), kernel, preferred_element_type=kernel.dtype, precision=PRECISION
        )
