"""The environment that gives rank processes this test process's compilation cache: each rank
is a one-rank engine like the tests' references, so it loads the programs they compiled."""

from __future__ import annotations

from pathlib import Path

import jax


def shared_cache_env(fallback: Path) -> dict[str, str]:
    """Environment variables for rank processes (and servers) to use this process's persistent
    compilation cache, or `fallback` when it has none; every program cached, however small."""
    return {
        "JAX_COMPILATION_CACHE_DIR": jax.config.jax_compilation_cache_dir or str(fallback),
        "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0",
        "JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES": "0",
    }
