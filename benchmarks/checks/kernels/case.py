"""One grid point of the kernel grid (`Shape`, built into a `Case`), the tolerance per op and dtype,
`judge`: a run's errors against its reference and the invariants every op keeps, and
`without_interpret` for the Mosaic GPU kernels' points."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import jax.numpy as jnp
import numpy as np

F32, BF16 = jnp.float32, jnp.bfloat16
# Relative error allowed per op and input dtype (bf16 inputs: bf16 dot operands and outputs).
TOLERANCE = {
    (F32, "conv"): 1e-5,
    (F32, "update"): 2e-5,
    (F32, "scan"): 1e-4,
    (BF16, "conv"): 1e-2,
    (BF16, "update"): 1e-2,
    (BF16, "scan"): 2e-2,
}


@dataclasses.dataclass(frozen=True)
class Case:
    """One built grid point: kernel(*args, interpret=) and reference(*args) return (out, pool)."""

    kernel: Callable
    reference: Callable
    args: tuple
    pool_index: int  # position of the state pool in args
    live: np.ndarray  # bool, broadcastable to out: the outputs that are compared (others are 0)
    written: np.ndarray  # slots the op may write; every other slot must stay bit-identical
    tol: float
    layout: str  # rows and tokens, for the report


@dataclasses.dataclass(frozen=True)
class Shape:
    name: str
    build: Callable[[np.random.Generator], Case]


def _rel(a: np.ndarray, b: np.ndarray) -> float:
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-30))


def judge(case: Case, out, pool, ref) -> tuple[bool, str]:
    """Errors of one run against its reference, and the invariants every op keeps."""
    out, pool, ref_out, ref_pool = (np.asarray(a, np.float32) for a in (out, pool, *ref))
    pool_in = np.asarray(case.args[case.pool_index], np.float32)
    live = np.broadcast_to(case.live, out.shape)
    written = np.unique(case.written[case.written > 0])
    kept = np.setdiff1d(np.arange(1, pool.shape[0]), written)
    err_out = _rel(out[live], ref_out[live])
    err_state = _rel(pool[written], ref_pool[written])
    problems = []
    if not (np.isfinite(out).all() and np.isfinite(pool[1:]).all()):
        problems.append("NaN/inf")
    if np.any(out[~live] != 0):
        problems.append("padding output not 0")
    if not np.isnan(pool[0]).all():
        problems.append("slot 0 written")
    if pool[kept].tobytes() != pool_in[kept].tobytes():
        problems.append("an unwritten slot changed")
    ok = not problems and err_out <= case.tol and err_state <= case.tol
    detail = f"out {err_out:.1e} state {err_state:.1e} (tol {case.tol:.0e}) {case.layout}"
    return ok, detail + "".join(f"; {p}" for p in problems)


def without_interpret(kernel: Callable) -> Callable:
    """A Mosaic GPU kernel, called as the grid calls kernels (with `interpret=`): it has no
    interpret mode that runs wgmma, so it runs on the GPU only."""

    def call(*args, interpret: bool, **kwargs):
        del interpret
        return kernel(*args, **kwargs)

    return call
