"""The kernels suite: each Pallas kernel of the models on the GPU, checked against its reference and
timed beside its anchor (mamba_ssm, FLA, torch) or the memory roofline.

Benches: `prefill` (SSD chunk scan, Gated DeltaNet chunk, causal conv1d prefill), `mamba2`
(`ssd_state_update`, `causal_conv1d_update`), `gdn` (`gdn_state_update`), `fused_decode`
(`mamba2_decode`, `gdn_decode` against the unfused paths), `paged_attention` (decode),
`prefill_attention`, `moe` (the grouped expert matmul), `matmul` (the batch-invariant fixed-tile
matmul against XLA's). Parts: the anchors' side (`anchors`), and one module per prefill op with
its case and timing (`prefill_ops/`).

    python -m benchmarks.kernels --help
"""
