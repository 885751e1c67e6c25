"""Test helpers that hold compiled programs live for one test module.

Every program XLA compiles for the CPU maps memory regions of its own, and they stay mapped while
anything (a runner, JAX's jit caches) keeps the executable. A test process that kept every program
it compiled reached the kernel's limit on memory maps per process (`vm.max_map_count`, 65530 by
default) after about 250 runtime tests, and the next compile segfaulted inside XLA: that was the
worker crash of CI in November 2026, always in whichever test compiled past the limit.

So helpers that build runners, engines or jitted functions are cached with `per_module`, not
`functools.cache`; after each test module the root conftest calls `release()`, which empties those
caches and JAX's, and `check_map_headroom()`, which fails loudly while there is still room if one
module alone comes near the limit.
"""

from __future__ import annotations

import functools
import gc
from collections.abc import Callable

import jax

MAP_LIMIT_FILE = "/proc/sys/vm/max_map_count"
HEADROOM = 0.75  # a module may use at most this share of the limit

_cache_clears: list[Callable[[], None]] = []


def per_module[F: Callable](fn: F) -> F:
    """`functools.cache` whose entries `release()` drops after the test module."""
    cached = functools.cache(fn)
    _cache_clears.append(cached.cache_clear)
    return cached


def release() -> None:
    """Drop every `per_module` entry and JAX's caches, so their executables are unmapped."""
    for cache_clear in _cache_clears:
        cache_clear()
    jax.clear_caches()
    gc.unfreeze()  # engines freeze what is alive when built (EngineConfig.freeze_gc): let it go
    gc.collect()


def memory_maps() -> int | None:
    """How many memory regions this process has mapped (None off Linux)."""
    try:
        with open("/proc/self/maps") as maps:
            return sum(1 for _ in maps)
    except OSError:
        return None


def map_limit() -> int | None:
    try:
        with open(MAP_LIMIT_FILE) as limit:
            return int(limit.read())
    except (OSError, ValueError):
        return None


def check_map_headroom(module: str) -> None:
    """Fail, naming the module, when it left the process near the map limit."""
    used, limit = memory_maps(), map_limit()
    if used is not None and limit is not None and used > HEADROOM * limit:
        raise AssertionError(
            f"{module} left {used} memory maps ({MAP_LIMIT_FILE} = {limit}): its compiled "
            "programs outlive it; cache them with tests.compiled.per_module"
        )
