"""`python -m benchmarks.checks BENCH [flags]`: the checks suite's one entry (`--help` lists its
benches)."""

import sys

from benchmarks.harness.suite import run_suite

BENCHES = ("gpu",)

if __name__ == "__main__":
    sys.exit(run_suite("benchmarks.checks", BENCHES))
