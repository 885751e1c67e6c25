"""`ExecutableStore`: compiled step programs on disk, loaded at the next start instead of traced
and compiled.

JAX's persistent compilation cache (`compile_cache.py`) skips XLA's compile, but a warm start
still traces and lowers every step variant to find its cache key (0.3-1 s a variant). This store
keys a variant by what determines its program before any tracing (the step's static `StepSpec`,
whose graph definition holds the model's config; the shapes, dtypes and shardings of every
argument; the devices; the versions of jax, jaxlib and of this package's code; the flags that
change what XLA emits) and keeps the serialised executable (`jax.experimental.
serialize_executable`), so a warm start traces and compiles no step at all.

An entry is one file, named by the key's hash, holding the key's full description, a checksum of
the payload and the payload. Loading checks both: a truncated, corrupt or foreign file (another
key's entry under this name) is ignored, removed and rebuilt, never run. Writes go to a temporary
file renamed into place, so a crash mid-write leaves no half entry. The store holds at most
`MAX_BYTES`; the least recently used entries go first.

Loading runs the executable's own pickle: only point the store at a directory you trust (it is
the user's cache directory by default, see `compile_cache.py`).
"""

from __future__ import annotations

import functools
import hashlib
import logging
import os
import pickle
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import jax
import jaxlib
from jax.experimental import serialize_executable

LOG = logging.getLogger(__name__)
MAGIC = b"jmamba-step-executable-1\n"
MAX_BYTES = 4 * 2**30
_PACKAGES = ("jmamba", "pallas_kernels", "runtime")  # the code a step program is traced from
_FLAGS = (  # jax settings that change the program XLA emits
    "jax_enable_x64",
    "jax_disable_most_optimizations",
    "jax_optimization_level",
    "jax_default_matmul_precision",
)


class ExecutableStore:
    """Serialised step executables in `directory`; a store without one keeps nothing (the
    seam is always there: `ModelRunner` asks, and compiles on a miss)."""

    def __init__(self, directory: Path | None) -> None:
        self.directory = directory
        self.num_loaded = 0
        self.num_saved = 0
        self.num_rejected = 0  # entries found but unusable (corrupt, truncated, foreign)

    def load(self, description: str, devices: Sequence[jax.Device]) -> Any | None:
        """The `jax.stages.Compiled` stored for `description` (a `describe` result), loaded onto
        `devices` (the program's, in its mesh's order), or None when there is none or it cannot
        be trusted (then it is removed)."""
        path = self._path(description)
        if path is None or not path.exists():
            return None
        try:
            payload = _read_entry(path.read_bytes(), description)
            serialized, in_tree, out_tree = pickle.loads(payload)
            compiled = serialize_executable.deserialize_and_load(
                serialized, in_tree, out_tree, devices[0].client, list(devices)
            )
        except Exception as error:  # any unreadable entry is rebuilt
            LOG.warning("ignoring the stored step executable %s: %s", path.name, error)
            self.num_rejected += 1
            path.unlink(missing_ok=True)
            return None
        os.utime(path)  # recently used: evicted last
        self.num_loaded += 1
        return compiled

    def save(self, description: str, compiled: Any) -> None:
        """Keep `compiled` for `description`; a program that cannot be serialised is skipped
        (logged), never an error."""
        path = self._path(description)
        if path is None:
            return
        try:
            payload = pickle.dumps(serialize_executable.serialize(compiled))
        except Exception as error:  # a store is an optimisation
            LOG.warning("step executable not stored: %s", error)
            return
        path.parent.mkdir(parents=True, exist_ok=True)
        _write_atomically(path, _entry(description, payload))
        self.num_saved += 1
        _evict(path.parent, MAX_BYTES)

    def _path(self, description: str) -> Path | None:
        if self.directory is None:
            return None
        return self.directory / f"{hashlib.sha256(description.encode()).hexdigest()}.step"


def describe(spec: Any, arguments: Any) -> str:
    """Everything a step program depends on, as text: its static `spec` (a dataclass whose repr
    holds the model's graph definition and config), each argument's shape, dtype and sharding,
    the devices, the software and the flags. Raises ValueError for a spec whose repr names an
    object by its address (it would never match in another process)."""
    spec_text = repr(spec)
    if " at 0x" in spec_text:
        raise ValueError(f"a step spec that names an object by address: {spec_text[:200]}")
    avals = [
        (a.shape, str(a.dtype), str(getattr(a, "sharding", None)))
        for a in jax.tree.leaves(arguments)
    ]
    devices = [(d.id, d.device_kind, d.process_index) for d in jax.devices()]
    backend = jax.devices()[0].client
    software = (jax.__version__, jaxlib.__version__, backend.platform_version, code_fingerprint())
    flags = [(name, str(jax.config.values.get(name))) for name in _FLAGS]
    environment = sorted(
        (k, v) for k, v in os.environ.items() if k.startswith(("XLA_", "JMAMBA_KERNEL"))
    )
    return "\n".join(map(repr, (spec_text, avals, devices, software, flags, environment)))


@functools.cache
def code_fingerprint() -> str:
    """A hash of every Python source file of the packages a step is traced from: any change to
    the code gives new keys."""
    digest = hashlib.sha256()
    root = Path(__file__).resolve().parents[2]
    for package in _PACKAGES:
        for source in sorted((root / package).rglob("*.py")):
            digest.update(str(source.relative_to(root)).encode())
            digest.update(source.read_bytes())
    return digest.hexdigest()


def _entry(description: str, payload: bytes) -> bytes:
    head = description.encode()
    checksum = hashlib.sha256(payload).digest()
    return MAGIC + len(head).to_bytes(8, "little") + head + checksum + payload


def _read_entry(data: bytes, description: str) -> bytes:
    """The payload of an entry, checked: its magic, that it was written for `description`, and
    its checksum."""
    if not data.startswith(MAGIC):
        raise ValueError("not a step executable entry")
    start = len(MAGIC) + 8
    size = int.from_bytes(data[len(MAGIC) : start], "little")
    if data[start : start + size].decode(errors="replace") != description:
        raise ValueError("the entry was written for another program")
    checksum, payload = data[start + size : start + size + 32], data[start + size + 32 :]
    if hashlib.sha256(payload).digest() != checksum:
        raise ValueError("checksum mismatch (truncated or corrupt)")
    return payload


def _write_atomically(path: Path, data: bytes) -> None:
    with tempfile.NamedTemporaryFile(dir=path.parent, suffix=".tmp", delete=False) as file:
        file.write(data)
    os.replace(file.name, path)


def _evict(directory: Path, max_bytes: int) -> None:
    """Remove the least recently used entries until the store holds at most `max_bytes`."""
    entries = sorted(directory.glob("*.step"), key=lambda p: p.stat().st_mtime)
    total = sum(p.stat().st_size for p in entries)
    for path in entries:
        if total <= max_bytes:
            break
        total -= path.stat().st_size
        path.unlink(missing_ok=True)
