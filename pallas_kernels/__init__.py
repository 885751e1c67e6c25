"""Pallas GPU kernels (Triton lowering; Mosaic GPU on Hopper for the Mamba2 scan and the Gated
DeltaNet chain) for hybrid-model serving, a folder per op family.

`ops.py` is the public face: the dispatched ops the models call (never a kernel module directly),
and `Rows`, the ragged-rows-with-slots argument of the prefill ops (`rows.py`). `_dispatch.py`
alone picks the kernel, the interpreted kernel or the plain-jnp reference; `_common.py` holds the
shape checks, slot helpers and kernel pieces the families share, `_hopper.py` what the Mosaic GPU
kernels share (where they run, their operands, SMEM tiles and stage loop). Families: `ssd/`
(Mamba2), `gdn/` (Gated DeltaNet), `conv/` (causal depthwise conv1d), `attention/` (paged
attention), `moe/` (grouped matmul), `matmul/` and `norm/` (the batch-invariant dense matmul and
norm statistics).
Each holds its kernels, its plain-jnp `reference.py` (with the input checks the kernels share)
and a file per public op. Imports point down: `ops` -> families -> `rows` -> `_common` (and the
Mosaic GPU kernels -> `_hopper`); `ssd/` and `gdn/` read `conv/reference.py` for their fused
decode references.
"""
