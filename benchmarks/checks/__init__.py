"""The checks suite: every kernel and model through the compiled kernels on the GPU, checked
against independent references (`python -m benchmarks.checks gpu`, also run as
`benchmarks/gpu_checks.py`).

Its sections, one module each: `kernel_grid` (with its grid points in `kernels/`), `fixtures`,
`batch_invariance`, `bf16_batch`, `tensor_parallel` and `fp8`; each module's `run(quick, families)`
returns a list of `Check`s. On the GPU every section runs the compiled Pallas kernels; on a CPU
(the CI smoke tests) the same code runs the kernels in interpret mode with `quick=True`, so the
checks cannot rot between device runs.
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
