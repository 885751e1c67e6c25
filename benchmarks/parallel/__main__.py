"""`python -m benchmarks.parallel BENCH [flags]`: the parallel suite's one entry (`--help` lists its
benches)."""

import sys

from benchmarks.harness.suite import run_suite

BENCHES = (
    "data_parallel",
    "disaggregation",
    "rank_processes",
    "tensor_parallel",
)

if __name__ == "__main__":
    sys.exit(run_suite("benchmarks.parallel", BENCHES))
