"""The serving suite: requests end to end, through `jmamba serve` or an engine with a prefix cache.

Benches: `serve` (the server's start-up, cold and warm, and `jmamba bench` workloads over HTTP
beside the same on an engine thread), `prefix_cache` (prefix caching off / align / all: time to
first token, throughput and hit rate).

    python -m benchmarks.serving --help
"""
