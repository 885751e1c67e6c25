"""JAX's persistent compilation cache, on by default for `LLM` and `jmamba generate`.

Compiling a step variant takes about a second on CPU for the tiny presets (more for real models);
with the cache, a second run of the same variant loads it from disk instead. The cache lives in
the user's cache directory (`$XDG_CACHE_HOME/jmamba/jax`, else `~/.cache/jmamba/jax`).
`JMAMBA_COMPILE_CACHE=off` (or 0, false, no) turns it off; any other value is the directory to
use; it holds at most 1 GiB. A cache directory the user gave JAX already
(`jax_compilation_cache_dir`, `JAX_COMPILATION_CACHE_DIR`) is left as it is.

Wherever JAX's cache is on, the step programs themselves are kept beside its entries, in its
`steps/` folder (`step_store`, `executable_store.py`): a warm start loads them without tracing.
`JMAMBA_STEP_STORE=off` keeps JAX's cache but not the step programs (the test suite does so: a
test that swaps a function the step calls must trace the step it runs).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # this module is imported before jax is (`enable` configures it)
    from runtime.device.executable_store import ExecutableStore

ENV = "JMAMBA_COMPILE_CACHE"
STEP_STORE_ENV = "JMAMBA_STEP_STORE"
_OFF = {"0", "off", "false", "no"}
MAX_BYTES = 2**30  # JAX evicts the least recently used entries beyond this


def default_directory() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "jmamba" / "jax"


def enable() -> str | None:
    """Point JAX's persistent compilation cache at the jmamba cache directory unless opted out
    or already configured; returns the directory in use (None when off)."""
    import jax

    setting = os.environ.get(ENV, "").strip()
    if setting.lower() in _OFF:
        return None
    current = jax.config.jax_compilation_cache_dir
    if current:
        return current
    directory = Path(setting) if setting else default_directory()
    jax.config.update("jax_compilation_cache_dir", str(directory))
    # JAX caches only compiles over 1 s by default; ours take 0.1 to a few seconds, and a step
    # variant is worth keeping even then (a few small eager ops are kept too).
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.1)
    jax.config.update("jax_compilation_cache_max_size", MAX_BYTES)
    return str(directory)


def step_store() -> ExecutableStore:
    """The store of compiled step programs: the `steps/` folder of JAX's persistent cache
    directory when that is on (JAX's eviction reads only the files at its top level),
    `JMAMBA_STEP_STORE` is not off and the backend is not the CPU, else a store that keeps
    nothing.

    Not on the CPU: XLA:CPU step programs serialised by one process and loaded by another
    failed at dispatch now and then in the test suite (2026-12-07, jax 0.11.2: "Error
    dispatching computation: Function negate_power_fusion not found", in 8 and 11 of ~1200
    tests of two runs whose xdist workers shared a store). Loaded in the process that compiled
    them they ran; on the GPU, loaded by a fresh `jmamba serve`, they ran (benchmarks/results)."""
    import jax

    from runtime.device.executable_store import ExecutableStore

    directory = jax.config.jax_compilation_cache_dir
    if os.environ.get(STEP_STORE_ENV, "").strip().lower() in _OFF:
        directory = None
    if jax.default_backend() == "cpu":
        directory = None
    return ExecutableStore(Path(directory) / "steps" if directory else None)
