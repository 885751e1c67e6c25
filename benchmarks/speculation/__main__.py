"""`python -m benchmarks.speculation BENCH [flags]`: the speculation suite's one entry (`--help`
lists its benches)."""

import sys

from benchmarks.harness.suite import run_suite

BENCHES = (
    "spec_decode",
    "draft_prefix",
    "mtp_step",
)

if __name__ == "__main__":
    sys.exit(run_suite("benchmarks.speculation", BENCHES))
