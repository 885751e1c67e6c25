"""`python -m benchmarks.serving BENCH [flags]`: the serving suite's one entry (`--help` lists its
benches)."""

import sys

from benchmarks.harness.suite import run_suite

BENCHES = (
    "serve",
    "prefix_cache",
    "structured_masks",
)

if __name__ == "__main__":
    sys.exit(run_suite("benchmarks.serving", BENCHES))
