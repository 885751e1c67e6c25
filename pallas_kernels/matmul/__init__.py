"""The model's dense matrix product with a fixed reduction order: out[r] = x[r] @ w, rounded the
same whatever other rows share the product (the batch-invariant projections of
`jmamba.layers.matmul`).

`reference.py` holds the plain-jnp reference (XLA's dot) and the input checks; `fixed_tiles.py`
is the op `matmul` with its `MatmulTuning`: static tiles and a split of K chosen from the weight's
shape alone. `fp8_weights.py` is the weight-only FP8 op `fp8_weight_matmul` (e4m3 weights with
fp32 block scales, read as stored, times bf16 activations; the same fixed plan), its reference and
checks in `fp8_reference.py`.
"""
