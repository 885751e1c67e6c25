"""The parallel suite: serving over several GPUs of one host.

Benches: `data_parallel` (DP = 1 against DP = N throughput, and the idle-rank check),
`tensor_parallel` (decode and prefill of models too large for one GPU, against a per-GPU
roofline).

    python -m benchmarks.parallel --help
"""
