"""The parallel suite: serving over several GPUs of one host.

Benches: `data_parallel` (DP = 1 against DP = N throughput, and the idle-rank check),
`tensor_parallel` (decode and prefill of models too large for one GPU, against a per-GPU
roofline), `disaggregation` (prefill on one GPU, decode on another, against one instance doing
both: TTFT, TPOT, the hand-over).

    python -m benchmarks.parallel --help
"""
