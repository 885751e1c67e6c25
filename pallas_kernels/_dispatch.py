"""The one place that decides how an op runs: a Mosaic GPU kernel for Hopper, the Pallas (Triton)
kernel, the interpreted kernel, or the jnp reference.

`implementation=None` means the Pallas kernels on GPU and the plain-jnp reference elsewhere. On
the GPU an op with a `HopperKernel` runs it where the kernel's `supports` says it applies (static:
shapes, dtypes, config, device), the Triton kernel elsewhere; `triton` asks for the Triton kernel
only. The environment variable `JMAMBA_KERNELS` (`pallas`, `triton`, `interpret` or `reference`)
overrides the automatic choice for debugging; tests pass `implementation="interpret"` to run the
Triton kernels on CPU (Mosaic GPU's interpret mode does not run wgmma).
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable
from typing import Literal, NamedTuple

import jax

Implementation = Literal["pallas", "triton", "interpret", "reference"]
_CHOICES: tuple[Implementation, ...] = ("pallas", "triton", "interpret", "reference")


class HopperKernel(NamedTuple):
    """An op's Mosaic GPU kernel: `kernel` takes the reference's arguments; `supports`, the same,
    says whether it runs them (a static property of the call, never of the batch's contents)."""

    supports: Callable[..., bool]
    kernel: Callable


def resolve(implementation: Implementation | None) -> Implementation:
    """Return the implementation to use for an op call."""
    if implementation is None:
        implementation = os.environ.get("JMAMBA_KERNELS") or None  # type: ignore[assignment]
    if implementation is None:
        return "pallas" if jax.default_backend() == "gpu" else "reference"
    if implementation not in _CHOICES:
        raise ValueError(f"implementation={implementation!r} must be one of {_CHOICES}")
    return implementation


def dispatched[F: Callable](
    kernel: Callable | None, reference: F, hopper: HopperKernel | None = None
) -> F:
    """Wrap an op so it takes `implementation=` and routes to its kernels or its reference.

    `kernel` (Triton) takes the reference's arguments plus keyword `interpret: bool`; `hopper`,
    when given, runs instead under "pallas" wherever it supports the call. Tuning knobs are not
    reachable through the dispatched op: call a kernel directly to tune it.
    """

    @functools.wraps(reference)
    def op(*args, implementation: Implementation | None = None, **kwargs):
        choice = resolve(implementation)
        if choice == "reference" or kernel is None:
            return reference(*args, **kwargs)
        if choice == "pallas" and hopper is not None and hopper.supports(*args, **kwargs):
            return hopper.kernel(*args, **kwargs)
        return kernel(*args, interpret=choice == "interpret", **kwargs)

    return op  # type: ignore[return-value]
