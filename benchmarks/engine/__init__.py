"""The parts of the engine benchmarks (`benchmarks/bench_engine.py`, `benchmarks/profile_engine.py`
and the benchmarks that reuse their models): the random bench models, a warmed engine and the
timing of its steps, the memory roofline, long-context decode, and for the profiler its variants,
trace and HLO parsing, runner timings and report."""
