"""Section `tp` of the GPU checks: tensor parallelism through the compiled kernels on real GPUs.
Each transformers fixture is served on one device and split over tp devices (and, with dp > 1,
over dp x tp); greedy tokens and (for dp = 1) every step's fp32 logits are compared
(tests/runtime/parallel/test_tensor_parallel.py does the same on fake CPU devices with the
reference kernels). A family fails if any token differs or a logit moves more than 1e-5.

Not a default section: it needs dp x tp devices. The mesh comes from `--tp` / `--dp`
(through $JMAMBA_CHECK_MESH, so that `--jobs` children see it too):

    PYTHONPATH=. python benchmarks/gpu_checks.py --only tp --tp 2 --dp 1 \
        --families qwen3_next,mamba2,falcon_h1,nemotron_h,qwen3_5_moe,bamba,granite_h
"""

from __future__ import annotations

import os
import time

import jax
import numpy as np

from benchmarks.checks import Check

MESH_ENV = "JMAMBA_CHECK_MESH"  # "DPxTP", set by gpu_checks.py's --dp and --tp
FAMILIES = ("qwen3_next", "mamba2", "falcon_h1", "nemotron_h")


def mesh() -> tuple[int, int]:
    """(dp, tp) of $JMAMBA_CHECK_MESH; (1, 2) when unset."""
    dp, tp = os.environ.get(MESH_ENV, "1x2").split("x")
    return int(dp), int(tp)


def check_family(name: str, dp: int, tp: int) -> Check:
    """Fixture `name` on one device against it on a dp x tp mesh."""
    from tests.runtime.parallel.test_tensor_parallel import LOGITS_TOLERANCE, run

    start = time.perf_counter()
    tokens_one, logits_one = run(name, 1, 1)
    tokens, logits = run(name, dp, tp)
    delta = 0.0  # rows of several dp ranks do not line up with one device's: tokens only
    if dp == 1:
        delta = max(float(np.abs(a - b).max()) for a, b in zip(logits_one, logits, strict=True))
    same = tokens == tokens_one
    detail = (
        f"tokens {'equal' if same else 'DIFFER'}, max|d logit| {delta:.1e} "
        f"(tol {LOGITS_TOLERANCE:.0e}, {time.perf_counter() - start:.0f} s)"
    )
    return Check(f"tp {name} dp={dp} tp={tp}", same and delta <= LOGITS_TOLERANCE, detail)


def run(quick: bool, families: list[str] | None = None) -> list[Check]:
    """Every family (default `FAMILIES`; `quick`: the first) on the mesh of `mesh()`."""
    dp, tp = mesh()
    if jax.device_count() < dp * tp:
        detail = f"needs {dp * tp} devices, {jax.device_count()} found"
        return [Check(f"tp dp={dp} tp={tp}", False, detail)]
    names = families or list(FAMILIES[:1] if quick else FAMILIES)
    return [check_family(name, dp, tp) for name in names]
