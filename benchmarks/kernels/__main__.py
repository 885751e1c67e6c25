"""`python -m benchmarks.kernels BENCH [flags]`: the kernels suite's one entry (`--help` lists its
benches)."""

import sys

from benchmarks.harness.suite import run_suite

BENCHES = (
    "prefill",
    "mamba2",
    "gdn",
    "fused_decode",
    "paged_attention",
    "prefill_attention",
    "moe",
    "matmul",
    "fp8_linear",
)

if __name__ == "__main__":
    sys.exit(run_suite("benchmarks.kernels", BENCHES))
