"""The batch-invariant switch: whether the step traced now runs its products and norm statistics
in an order fixed by static shapes (`EngineConfig.batch_invariant`).

On the GPU XLA picks how to multiply and how to reduce a row by the whole shape and by what it
fuses the operation with, so a row's bf16 outputs can round differently with the number of rows
in the step: a request's greedy tokens then depend on its batch and on speculative lanes
(benchmarks/results/README.md). Inside `batch_invariant()` the model's products run
`pallas_kernels.ops.matmul` (`jmamba.layers.matmul`) and its norms' sums of squares
`pallas_kernels.ops.row_sum_squares` (`jmamba.layers.norms`), and the MoE router's softmax and
its sums over experts and choices fold in order or run as that product (`jmamba.layers.moe`):
every choice comes from the weight's or the row's shape alone. The switch is read when a step is
traced, so it is part of what a compiled step is specialised on. On the CPU both ops run their
references.
`benchmarks/gpu_checks.py --only bf16` checks the NemotronH and Qwen3-Next bench shapes.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator

_ON = contextvars.ContextVar("batch_invariant", default=False)


@contextlib.contextmanager
def batch_invariant(on: bool = True) -> Iterator[None]:
    """Steps traced inside run the fixed-order products and norm statistics when `on`."""
    token = _ON.set(on)
    try:
        yield
    finally:
        _ON.reset(token)


def is_batch_invariant() -> bool:
    """Whether the step being traced asked for batch-invariant operations."""
    return _ON.get()
