"""What every suite measures with, importing nothing of the suites: the random bench models
(`models`), a warmed engine and its timed steps (`serving`), the bytes a step must move and the
measured bandwidth (`roofline`), jitted timing loops whose host round trip cancels (`timing`),
jax.profiler traces (`trace`), and the one entry each suite's `__main__` runs (`suite`)."""
