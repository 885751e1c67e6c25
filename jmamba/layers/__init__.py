"""The layers' building blocks below the token mixers: `linear` (the bias-free `Linear`) and the
one product it runs (`matmul`, batch-invariant under `invariance`), `norms`, `rope`, the FFNs
(`mlp`, `moe`), `fp32_param` (parameters kept in fp32 in any model dtype) and `lora` (folded
adapters kept for the writer)."""
