"""Sections of `benchmarks/gpu_checks.py`: each module's `run(quick)` returns a list of `Check`s.

On the GPU every section runs the compiled Pallas kernels; on a CPU (the CI smoke test) the same
code runs the kernels in interpret mode with `quick=True`, so the script cannot rot between device
runs.
"""

from __future__ import annotations

import dataclasses
import os

import jax


@dataclasses.dataclass(frozen=True)
class Check:
    """One named check: passed or not, and what was measured (errors, shapes, seconds)."""

    name: str
    ok: bool
    detail: str


def on_gpu() -> bool:
    return jax.default_backend() == "gpu"


def kernel_implementation() -> str:
    """`pallas` on a GPU, `interpret` elsewhere (what `_dispatch` should run in a check)."""
    return "pallas" if on_gpu() else "interpret"


def use_kernels() -> None:
    """Route the models' dispatched ops to the kernels (compiled on GPU, interpreted on CPU)."""
    os.environ["JMAMBA_KERNELS"] = kernel_implementation()
