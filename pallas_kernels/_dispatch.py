"""The one place that decides how an op runs: Pallas kernel, interpreted kernel, or jnp reference.

`implementation=None` means the Pallas kernel on GPU and the plain-jnp reference elsewhere. The
environment variable `JMAMBA_KERNELS` (`pallas`, `interpret` or `reference`) overrides the automatic
choice for debugging; tests pass `implementation="interpret"` to run the kernels on CPU.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable
from typing import Literal

import jax

Implementation = Literal["pallas", "interpret", "reference"]
_CHOICES: tuple[Implementation, ...] = ("pallas", "interpret", "reference")


def resolve(implementation: Implementation | None) -> Implementation:
    """Return the implementation to use for an op call."""
    if implementation is None:
        implementation = os.environ.get("JMAMBA_KERNELS") or None  # type: ignore[assignment]
    if implementation is None:
        return "pallas" if jax.default_backend() == "gpu" else "reference"
    if implementation not in _CHOICES:
        raise ValueError(f"implementation={implementation!r} must be one of {_CHOICES}")
    return implementation


def dispatched[F: Callable](kernel: Callable | None, reference: F) -> F:
    """Wrap an op so it takes `implementation=` and routes to its kernel or its reference.

    `kernel` takes the reference's arguments plus keyword `interpret: bool`. Its tuning knobs are
    not reachable through the dispatched op: call the kernel directly to tune it.
    """

    @functools.wraps(reference)
    def op(*args, implementation: Implementation | None = None, **kwargs):
        choice = resolve(implementation)
        if choice == "reference" or kernel is None:
            return reference(*args, **kwargs)
        return kernel(*args, interpret=choice == "interpret", **kwargs)

    return op  # type: ignore[return-value]
