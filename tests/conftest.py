"""Test-wide setup: fake CPU devices, XLA at its lowest optimisation level, hypothesis profiles,
optional persistent compilation cache, compiled programs freed after each module."""

from __future__ import annotations

import os

import jax

# Several fake CPU devices for the data-parallel tests. Must run before any backend initialises.
jax.config.update("jax_num_cpu_devices", 4)
jax.config.update("jax_enable_x64", False)

# Compiling dominates the suite's time (tiny models, many step variants), and XLA's CPU compiler
# at its lowest optimisation level shortens it: tests/runtime/test_async_scheduling.py ran in
# 52 s instead of 82 s on 2 cores. Semantics do not depend on it; the GPU checks
# (benchmarks/gpu_checks.py) compile at the default level. Subprocesses (multihost, CLI smoke
# runs) get it through the environment.
# JAX_DISABLE_MOST_OPTIMIZATIONS=0 restores the default.
os.environ.setdefault("JAX_DISABLE_MOST_OPTIMIZATIONS", "1")
jax.config.update(
    "jax_disable_most_optimizations", os.environ["JAX_DISABLE_MOST_OPTIMIZATIONS"] != "0"
)

# LLM turns on a persistent compilation cache in the user's cache directory; tests stay hermetic
# (JAX_CACHE_DIR below is CI's own cache, inside the checkout).
os.environ.setdefault("JMAMBA_COMPILE_CACHE", "off")

if os.environ.get("JAX_CACHE_DIR"):
    jax.config.update("jax_compilation_cache_dir", os.environ["JAX_CACHE_DIR"])
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)

import pytest  # noqa: E402
from hypothesis import HealthCheck, settings  # noqa: E402

from tests.compiled import check_map_headroom, release  # noqa: E402

# Hypothesis profiles, picked by HYPOTHESIS_PROFILE: "ci" (the default, sized for CI time) and
# "long" (>= 1000 examples per property; run it before landing runtime changes). JAX compiles on
# the first example of every new shape: deadlines would make every test flaky.
_COMMON = dict(deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.register_profile("ci", max_examples=50, **_COMMON)
settings.register_profile("long", max_examples=1000, **_COMMON)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))


@pytest.fixture(autouse=True, scope="module")
def _release_compiled_programs(request):
    """Each module's compiled programs are freed after it: see tests/compiled.py."""
    yield
    check_map_headroom(request.module.__name__)
    release()
