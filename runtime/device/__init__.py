"""The device side of a step: the jitted SPMD step per bucket and what surrounds it.

`model_runner.py` compiles and runs one step variant per (bucket, sampling mode, carry) over the
data-parallel mesh (`distributed.py`), with the caches donated; `packing.py` packs a rank's inputs
into one int32 row (one host-to-device copy); `step_buffers.py` keeps every buffer the step
touches at a fixed address, so XLA replays the step's recorded CUDA graph; `sampler.py` samples
inside the step; `compile_cache.py` turns on JAX's persistent compilation cache.
"""
