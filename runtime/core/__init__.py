"""The host side of a step, jax-free: the vocabulary (config, request, sampling params, schedule,
pools) and the policy (scheduler, slot planner, buckets, builder).

Nothing here imports jax, flax or the kernels (tests/runtime/core/test_host_modules.py checks it in
a fresh interpreter), and nothing here imports a feature wing: prefix caching and speculative
decoding plug in through the `SlotPlanner` seam (`slots.py`) and the scheduler's `num_drafts`
callback, and their config types live here as plain vocabulary (`speculative_config.py`,
`EngineArgs.prefix_caching`).
"""
