"""Gated DeltaNet: the gated delta rule S = exp(g) S + beta (v - exp(g) S k) k^T, o = S q over a
per-value-head [V, K] state held in slot-indexed pools.

`reference.py` holds the plain-jnp definitions (token-by-token prefill, decode update with the
gating fused, fused decode step) and the input checks the kernels share; `reference_chunked.py`
the chunked WY / UT form of the prefill, the math of its kernels. `chunk.py` is the prefill op
`gdn_chunk` with its `ChunkTuning` and the sequential chain kernel; `intra.py` its first kernel,
the per-chunk tiles that do not depend on the state; `chain_mgpu.py` the chain in Mosaic GPU,
which the op runs on Hopper. `state_update.py` is the decode op `gdn_state_update` (1 + K lanes)
and `decode.py` the fused decode step the model runs, `gdn_decode` (qkv conv update + l2norm +
gating + delta rule from in_proj's output).
"""
