"""Test-wide setup: fake CPU devices, hypothesis profile, optional persistent compilation cache."""

from __future__ import annotations

import os

import jax

# Several fake CPU devices for the data-parallel tests. Must run before any backend initialises.
jax.config.update("jax_num_cpu_devices", 4)
jax.config.update("jax_enable_x64", False)

if os.environ.get("JAX_CACHE_DIR"):
    jax.config.update("jax_compilation_cache_dir", os.environ["JAX_CACHE_DIR"])
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)

from hypothesis import HealthCheck, settings  # noqa: E402

# JAX compiles on the first example of every new shape: deadlines would make every test flaky.
settings.register_profile(
    "jax", deadline=None, max_examples=10, suppress_health_check=[HealthCheck.too_slow]
)
settings.load_profile("jax")
