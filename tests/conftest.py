"""Test-wide setup: fake CPU devices, XLA at its lowest optimisation level, hypothesis profiles,
one compilation cache per run shared by the xdist workers, compiled programs freed after each
module."""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

import jax

# Several fake CPU devices for the data-parallel tests. Must run before any backend initialises.
jax.config.update("jax_num_cpu_devices", 4)
jax.config.update("jax_enable_x64", False)

# Compiling dominates the suite's time (tiny models, many step variants), and XLA's CPU compiler
# at its lowest optimisation level shortens it: tests/runtime/engine/test_async_scheduling.py ran in
# 52 s instead of 82 s on 2 cores. Semantics do not depend on it; the GPU checks
# (benchmarks/gpu_checks.py) compile at the default level. Subprocesses (multihost, CLI smoke
# runs) get it through the environment.
# JAX_DISABLE_MOST_OPTIMIZATIONS=0 restores the default.
os.environ.setdefault("JAX_DISABLE_MOST_OPTIMIZATIONS", "1")
jax.config.update(
    "jax_disable_most_optimizations", os.environ["JAX_DISABLE_MOST_OPTIMIZATIONS"] != "0"
)

# LLM turns on a persistent compilation cache in the user's cache directory; tests stay hermetic
# and use one of their own per run (below).
os.environ.setdefault("JMAMBA_COMPILE_CACHE", "off")
# Nor do runners keep their compiled steps in the run's cache (runtime/device/compile_cache.py):
# a step loaded from another module's runner would skip what this module patches into the
# trace (tests/runtime/engine/test_batch_invariant.py counts the products it traces). The store's
# own tests give their runners a store of their own.
os.environ.setdefault("JMAMBA_STEP_STORE", "off")

# One compilation cache per test run, shared by the xdist workers. Each module recompiles the
# runners it builds (tests/compiled.py frees them after the module), and most of those programs
# are the same from module to module and from worker to worker, so they load instead. (xdist
# hands out whole files, `--dist loadfile` in pyproject.toml, so a module's runners compile in
# one worker only: 677 tests in 501 s instead of 637 s on the 2-core machine.) The run's
# first process makes the directory (under .jax_cache/, git-ignored) and removes it at the end;
# workers find it in RUN_CACHE_ENV. JAX_CACHE_DIR names a directory to use instead (kept), and
# JAX_CACHE_DIR=off turns the cache off.
RUN_CACHE_ENV = "JMAMBA_TEST_RUN_CACHE"
RUN_CACHES = Path(__file__).parents[1] / ".jax_cache" / "test-runs"


def _use_compile_cache(path: str) -> None:
    jax.config.update("jax_compilation_cache_dir", path)
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
    # And the processes the tests start (servers, README and CLI commands, rank processes,
    # multi-host workers, replicas), which read these at import: a server or command whose
    # programs a test or an earlier process compiled loads them. A bench that must compile from
    # nothing drops them from its child's environment (benchmarks/engine/compile_time.py).
    os.environ.update(
        JAX_COMPILATION_CACHE_DIR=path,
        JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0",
        JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES="0",
    )


def _cache_dir() -> str | None:
    """The directory of this run's cache, when this process already knows it."""
    given = os.environ.get("JAX_CACHE_DIR")
    if given == "off":
        return None
    return given or os.environ.get(RUN_CACHE_ENV)


if _cache_dir():  # an xdist worker, or a run with JAX_CACHE_DIR
    _use_compile_cache(_cache_dir())

import pytest  # noqa: E402
from hypothesis import HealthCheck, settings  # noqa: E402

from tests.compiled import check_map_headroom, release  # noqa: E402

# Hypothesis profiles, picked by HYPOTHESIS_PROFILE: "ci" (the default, sized for CI time: 40
# examples took the suite past 12 minutes on the 2-core machine in November 2026) and "long"
# (>= 1000 examples per property; run it before landing runtime changes). JAX compiles on the
# first example of every new shape: deadlines would make every test flaky.
_COMMON = dict(deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.register_profile("ci", max_examples=25, **_COMMON)
settings.register_profile("long", max_examples=1000, **_COMMON)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))


@pytest.fixture(autouse=True, scope="module")
def _release_compiled_programs(request):
    """Each module's compiled programs are freed after it: see tests/compiled.py."""
    yield
    check_map_headroom(request.module.__name__)
    release()


def pytest_configure(config: pytest.Config) -> None:
    """The run's first process (not an xdist worker) makes the run's compilation cache."""
    if hasattr(config, "workerinput") or os.environ.get("JAX_CACHE_DIR") or _cache_dir():
        return
    RUN_CACHES.mkdir(parents=True, exist_ok=True)
    run_cache = tempfile.mkdtemp(prefix="run-", dir=RUN_CACHES)
    os.environ[RUN_CACHE_ENV] = run_cache  # the workers, started after this, inherit it
    _use_compile_cache(run_cache)


def pytest_unconfigure(config: pytest.Config) -> None:
    if hasattr(config, "workerinput") or os.environ.get("JAX_CACHE_DIR"):
        return
    run_cache = os.environ.pop(RUN_CACHE_ENV, None)
    if run_cache:
        shutil.rmtree(run_cache, ignore_errors=True)


# The longest files first. With `--dist loadfile` a file runs whole on one worker, and a long
# file collected last keeps one worker busy at the end of CI while the other sits idle. The
# order is that of the files' summed test times in a CI run (2026-11-27, junit times); the
# other files keep their order.
_LONGEST_FIRST = (
    "tests/jmamba/test_parity.py",
    "tests/runtime/speculative/test_speculative.py",
    "tests/runtime/speculative/test_speculative_schedules.py",
    "tests/test_readme.py",
    "tests/runtime/engine/test_async_scheduling.py",
    "tests/runtime/serve/test_serve.py",
    "tests/runtime/speculative/test_mtp_engine.py",
    "tests/runtime/parallel/test_tensor_parallel.py",
)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    rank = {path: i for i, path in enumerate(_LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.nodeid.partition("::")[0], len(rank)))
