"""Mamba2 SSD: the selective state-space recurrence s = exp(dt A) s + dt x B^T, y = s C + D x
(arXiv 2405.21060) over a per-head [P, N] state held in slot-indexed pools.

`reference.py` holds the plain-jnp definitions (prefill scan, decode update, fused decode step) and
the input checks the kernels share. `chunk_scan.py` is the prefill op `ssd_chunk_scan` with its
`ScanTuning`, choosing between two algorithms: `sequential.py` (one program walks a row's chunks)
and `chunk_kernels.py` (four parallel launches: chunk states, state pass, C B^T, outputs);
`sequential_mgpu.py` is the sequential algorithm in Mosaic GPU, which the op runs on Hopper.
`state_update.py` is the decode op `ssd_state_update` (1 + K lanes), and `decode.py` the fused
decode step the model runs, `mamba2_decode` (conv update + state update from in_proj's output).
"""
