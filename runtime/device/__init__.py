"""The device side of a step: the jitted SPMD step per bucket and what surrounds it.

`model_runner.py` compiles and runs one step variant per (bucket, sampling mode, drafts, steps)
over the `(dp, tp)` mesh (`distributed.py`), with the caches donated, and returns each step's
`StepResult` (`step_result.py`); `spmd_step.py` is the step itself, its static choices one
`StepSpec`; `memory.py` sizes the pools from the device's memory and resolves an engine's
`EngineArgs` for its model (`resolve_config`); `placement.py` puts each device's parameter and
cache shards on it (`footprint.py` logs their bytes); `packing.py` packs a rank's inputs into one
int32 row (one host-to-device copy); `step_buffers.py` keeps every buffer the step touches at a
fixed address, so XLA replays the step's recorded CUDA graph; `sampler.py` samples inside the
step; `chaining.py` feeds a step the tokens (and drafts) of the one before it on the device;
`mtp_drafts.py` runs the MTP head after sampling; `kv_addressing.py` maps positions to KV slots;
`compile_cache.py` turns on JAX's persistent compilation cache.
"""
