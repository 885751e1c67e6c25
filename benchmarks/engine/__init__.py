"""The engine suite: what the serving engine's decode step costs on one device.

Benches: `decode` (step time, tokens/s, host and device time against the memory roofline, and
long-context rows), `profile_step` (where the step's time goes: kernels, GPU busy time, transfers,
XLA flags), `profile_host` (the host's CPU time of a step, by part). Parts: long-context decode
(`long_context`), HLO parsing (`hlo`), runner timings (`runner_timing`), the profiler's variants
(`variants`) and its report (`profile_report`).

    python -m benchmarks.engine --help
"""
