"""The GPU checks (benchmarks/checks/gpu.py) on CPU: every grid point builds and lowers, the kernel
section runs end to end in interpret mode (its matmul points: the kernels' own tests compare every
kernel with its reference in interpret mode, so the whole quick grid here would repeat them; 16 s of
CI), and a kernel that hangs is reported as a failed check instead of blocking the report."""

from __future__ import annotations

import functools
import time

import jax
import numpy as np
import pytest

from benchmarks.checks import gpu, kernel_grid
from pallas_kernels._common import lower_for_cuda


def _slow_case(rng) -> kernel_grid.Case:
    def stuck(x, pool, *, interpret):  # returns only after the run limit
        out = jax.ShapeDtypeStruct(x.shape, x.dtype)
        return jax.pure_callback(lambda v: (time.sleep(2.0), v)[1], out, x), pool

    pool = np.zeros((2, 3), np.float32)
    pool[0] = np.nan
    return kernel_grid.Case(
        stuck,
        lambda x, pool: (x, pool),
        (np.ones(4, np.float32), pool),
        1,
        np.ones(4, bool),
        np.zeros(0, np.int32),
        1e-5,
        "stuck",
    )


def test_a_hung_kernel_fails_its_check_and_skips_the_rest(monkeypatch):
    monkeypatch.setattr(kernel_grid, "RUN_LIMIT_S", 0.2)
    shapes = [kernel_grid.Shape("stuck", _slow_case), kernel_grid.Shape("next", _slow_case)]
    monkeypatch.setattr(kernel_grid, "grid", lambda quick: shapes)
    checks = kernel_grid.run(quick=True)
    assert [c.ok for c in checks] == [False, False]
    assert checks[0].detail.startswith("hung") and checks[1].detail.startswith("not run")
    time.sleep(2.5)  # let the stuck callback finish before the test ends


def test_full_grid_lowers_for_the_gpu():
    """Every GPU grid point builds, its kernel lowers to Triton IR or a Mosaic GPU module (no
    PTX; Mosaic GPU's layout inference runs here) and its reference traces, on this CPU
    machine: the GPU run cannot fail on a shape or layout error."""
    for i, shape in enumerate(kernel_grid.grid(quick=False)):
        case = shape.build(np.random.default_rng(i))
        text = lower_for_cuda(functools.partial(case.kernel, interpret=False), *case.args)
        backend = "mosaic_gpu" if " hopper " in shape.name else "triton"
        assert backend in text, shape.name
        jax.eval_shape(case.reference, *case.args)


def test_ops_pick_their_grid_points_and_unknown_ops_are_refused(monkeypatch, capsys):
    """`--ops matmul` runs the matmul points only; an op the grid lacks is a usage error naming
    the grid's ops."""
    monkeypatch.setenv("JMAMBA_CHECK_SEED", "0")  # CI repeats one draw; the GPU run draws afresh
    monkeypatch.setenv(kernel_grid.OPS_ENV, "")  # main sets it; restored (unset) afterwards
    assert gpu.main(["--quick", "--only", "kernels", "--ops", "matmul"]) == 0
    run = [line for line in capsys.readouterr().out.splitlines() if line.startswith("ok")]
    assert run and all(line.split()[1] == "matmul" for line in run)
    with pytest.raises(SystemExit):
        gpu.main(["--only", "kernels", "--ops", "matmul,nope"])
    assert "no grid points for ['nope']" in capsys.readouterr().err
