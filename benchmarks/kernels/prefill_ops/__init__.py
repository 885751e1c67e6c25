"""The parts of the `prefill` bench (`benchmarks/kernels/prefill.py`): what a timed op is (`case`),
how it is timed (`timing`: the config sweep, the per-kernel breakdown, the anchor beside the fastest
config), and one module per op with its shapes, tuning configs and anchor (`ssd`, `gdn`, `conv`)."""
