"""`Fp32Param`: a parameter whose role needs fp32 whatever dtype the model serves in.

The matmul weights (Linear kernels, the embedding, the MoE expert stacks) are what a step reads
most and take the serving dtype. The small vectors and taps below are read by fp32 math: keeping
them fp32 at cast and load time means the decode step converts none of them, and a bf16 model
loses no precision in them. Each is declared where it is created:

* every norm weight (RMSNorm, the gated norms of Mamba2 and Gated DeltaNet);
* the Mamba2 and Gated DeltaNet scalars per head: A (A_log), D, dt_bias;
* the causal-conv taps and bias (the conv kernels compute in fp32);
* the MoE router kernel and its correction bias (top-k on near-tied scores flips with bf16
  logits; NemotronH's reference keeps its router in fp32 too).
"""

from __future__ import annotations

from flax import nnx


class Fp32Param(nnx.Param):
    """An `nnx.Param` that `jmamba.checkpoints.weights.cast` and `load_pretrained` keep in fp32."""
