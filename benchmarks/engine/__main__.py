"""`python -m benchmarks.engine BENCH [flags]`: the engine suite's one entry (`--help` lists its
benches)."""

import sys

from benchmarks.harness.suite import run_suite

BENCHES = (
    "decode",
    "multi_step",
    "profile_step",
    "profile_host",
    "sampler_modes",
    "compile_time",
)

if __name__ == "__main__":
    sys.exit(run_suite("benchmarks.engine", BENCHES))
