"""Rows' sums of squares: the kernel (interpret mode) against a float64 numpy sum and against XLA's
reduction (the reference); a row's bitwise independence from the other rows; the norms of
`jmamba.layers.norms` running it under `batch_invariant()`.

Odd R / D (one partial block of rows, a row walked in slices of 4096 with a short last one), bf16
and fp32 inputs, rows past R never written.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jmamba.layers.invariance import batch_invariant
from jmamba.layers.norms import GroupGatedRMSNorm, RMSNorm
from pallas_kernels import ops
from pallas_kernels.norm.reference import row_sum_squares_reference
from pallas_kernels.norm.sum_squares import row_sum_squares


def make_rows(rng, r: int, d: int, dtype) -> np.ndarray:
    return np.array(jnp.asarray(rng.standard_normal((r, d)).astype(np.float32), dtype))


@pytest.mark.parametrize("r, d", [(1, 24), (5, 80), (37, 200), (3, 9000)])
@pytest.mark.parametrize("dtype", [np.float32, jnp.bfloat16])
def test_matches_oracle_and_reference(r, d, dtype):
    x = make_rows(np.random.default_rng(r * 100 + d), r, d, dtype)
    want = (np.asarray(x, np.float64) ** 2).sum(axis=1)
    out = np.asarray(row_sum_squares(x, interpret=True))
    assert out.dtype == np.float32 and out.shape == (r,)
    np.testing.assert_allclose(out, want, rtol=1e-5)
    np.testing.assert_allclose(np.asarray(row_sum_squares_reference(x)), want, rtol=1e-5)


def test_a_row_does_not_depend_on_other_rows():
    rng = np.random.default_rng(4)
    x = make_rows(rng, 40, 200, jnp.bfloat16)
    alone = np.asarray(row_sum_squares(x[7:8], interpret=True))
    for r, place in ((2, 1), (9, 8), (40, 7), (53, 50)):
        rows = make_rows(rng, r, 200, jnp.bfloat16)
        rows[place] = x[7]
        out = np.asarray(row_sum_squares(rows, interpret=True))[place : place + 1]
        assert out.tobytes() == alone.tobytes(), (r, place)


def test_norms_run_the_kernel_under_the_switch(monkeypatch):
    """RMSNorm and the gated group norm call ops.row_sum_squares inside `batch_invariant()`
    (leading axes and groups flattened into rows) and XLA's reduction outside; same values."""
    calls = []
    interpreted = functools.partial(ops.row_sum_squares, implementation="interpret")
    monkeypatch.setattr(ops, "row_sum_squares", lambda x: calls.append(x.shape) or interpreted(x))
    keys = jax.random.split(jax.random.key(0), 3)
    x = jax.random.normal(keys[0], (3, 5, 48), jnp.bfloat16)
    rms, gated = RMSNorm(48, 1e-6), GroupGatedRMSNorm(48, 16, 1e-6)
    y, z = jax.random.normal(keys[1], (7, 48)), jax.random.normal(keys[2], (7, 48))
    plain = (rms(x), gated(y, z))
    assert not calls
    with batch_invariant():
        fixed = (rms(x), gated(y, z))
    assert calls == [(15, 48), (21, 16)]
    for a, b in zip(plain, fixed, strict=True):
        np.testing.assert_allclose(np.asarray(a, np.float32), np.asarray(b, np.float32), atol=2e-2)


def test_bad_input_raises():
    with pytest.raises(ValueError, match="x has shape"):
        row_sum_squares(np.zeros((2, 3, 4), np.float32), interpret=True)
    with pytest.raises(ValueError, match="x has dtype int32"):
        row_sum_squares_reference(np.zeros((2, 3), np.int32))
