"""Grouped matmul for the routed experts of a MoE layer: rows grouped by expert, out[r] =
lhs[r] @ rhs[group of r] (the semantics of `jax.lax.ragged_dot`).

`reference.py` holds the plain-jnp reference (XLA's ragged_dot) and the input checks;
`grouped_matmul.py` is the op `grouped_matmul` with its `GroupedMatmulTuning`, a kernel that reads
only the experts that have rows; `fp8_grouped_matmul.py` runs the same kernel on e4m3 expert
weights with fp32 block scales (weight-only FP8), `fp8_reference.py` its dequantizing reference.
"""
