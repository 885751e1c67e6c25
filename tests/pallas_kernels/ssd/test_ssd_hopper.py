"""The Mosaic GPU SSD scan (`ssd/sequential_mgpu.py`) on CPU: what can be checked without an sm_90.

Its math runs on the GPU only (Mosaic GPU's interpret mode does not run wgmma): gpu_checks.py's
`hopper` grid points compare it with the reference there, and `test_full_grid_lowers_for_the_gpu`
lowers them for CUDA here. This file checks the XLA side (the chunk rows of dt' and the decay)
against a loop written from the definition, when the kernel applies, and how `_dispatch` routes.
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest

from pallas_kernels import _dispatch
from pallas_kernels.rows import Rows
from pallas_kernels.ssd import sequential_mgpu as hopper


def _chunks_by_loop(lengths, computed, dtp, A):
    """Per chunk, in call order: (dt' rows, inclusive cumsum of dt' A) of its tokens, chunks
    ending where a row's absolute position reaches a multiple of Q."""
    out, start = [], 0
    for length, pos in zip(lengths, computed, strict=True):
        t, end = start, start + length
        while t < end:
            n = min(end - t, hopper.Q - pos % hopper.Q)
            out.append((dtp[t : t + n], np.cumsum(dtp[t : t + n] * A, axis=0)))
            t, pos = t + n, pos + n
        start = end
    return out


@pytest.mark.parametrize(
    "lengths, computed, tokens",
    [((100, 70, 0, 80), (0, 62, 5, 0), 300), ((1, 64, 65, 129), (63, 0, 64, 7), 270)],
)
def test_decay_rows_hold_each_chunks_tokens_from_lane_zero(lengths, computed, tokens):
    rng = np.random.default_rng(0)
    heads = 3
    dt = rng.standard_normal((tokens, heads)).astype(np.float32)
    A = -np.abs(rng.standard_normal(heads)).astype(np.float32)
    qsl = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)
    meta = (jnp.asarray(qsl), jnp.asarray(computed, jnp.int32))
    limit = (0.0, float("inf"))
    args = (meta, jnp.asarray(dt), jnp.asarray(A), jnp.zeros(heads))
    dt_rows, cum_rows, first = hopper.decay_inputs(*args, dt_softplus=True, dt_limit=limit)
    dt_rows, cum_rows = np.asarray(dt_rows), np.asarray(cum_rows)
    q = hopper.Q
    chunks = _chunks_by_loop(lengths, computed, np.log1p(np.exp(dt)), A)
    for c, (want_dt, want_cum) in enumerate(chunks):
        n = len(want_dt)
        np.testing.assert_allclose(dt_rows[:, c * q : c * q + n].T, want_dt, rtol=1e-6)
        np.testing.assert_allclose(cum_rows[:, c * q : c * q + n].T, want_cum, rtol=1e-5)
        assert not dt_rows[:, c * q + n : (c + 1) * q].any()  # lanes past the chunk: no token
    assert not dt_rows[:, len(chunks) * q :].any()  # padding tokens land nowhere
    per_row = [
        len(_chunks_by_loop([n], [p], dt, A)) for n, p in zip(lengths, computed, strict=True)
    ]
    firsts = np.cumsum([0, *per_row])
    live = np.asarray(lengths) > 0
    np.testing.assert_array_equal(np.asarray(first)[live], firsts[:-1][live])


def _args(head_dim=64, state=128, dtype=jnp.bfloat16, pool_dtype=jnp.float32):
    t, heads, groups = 70, 4, 2
    rows = Rows(
        jnp.array([0, 70], jnp.int32),
        jnp.zeros(1, jnp.int32),
        jnp.zeros(1, bool),
        jnp.zeros(1, jnp.int32),
        jnp.ones(1, jnp.int32),
    )
    return (
        jnp.zeros((t, heads, head_dim), dtype),
        jnp.zeros((t, heads), dtype),
        jnp.zeros(heads),
        jnp.zeros((t, groups, state), dtype),
        jnp.zeros((t, groups, state), dtype),
        jnp.zeros((3, heads, head_dim, state), pool_dtype),
        rows,
    )


def _fits(args, chunk_size=256, algorithm="sequential"):
    x, _, _, B, C, pool, _ = args
    return hopper.fits(x, B, C, pool, chunk_size, algorithm)


def test_fits_names_the_shapes_it_takes_and_supports_needs_an_sm90():
    assert _fits(_args())
    assert not _fits(_args(), algorithm="parallel")
    assert not _fits(_args(), chunk_size=32)  # chunks a multiple of Q
    for bad in (
        _args(head_dim=48),
        _args(state=96),
        _args(dtype=jnp.float32),
        _args(pool_dtype=jnp.bfloat16),
    ):
        assert not _fits(bad)
    assert not hopper.supports(*_args())  # this machine is no sm_90


def test_supports_reads_the_call_as_the_op_takes_it(monkeypatch):
    monkeypatch.setattr(hopper, "on_hopper", lambda: True)
    x, dt, A, B, C, pool, rows = _args()
    D = jnp.ones(A.shape)
    assert hopper.supports(x, dt, A, B, C, pool, rows, D=D, chunk_size=128)
    assert hopper.supports(x, dt, A, B=B, C=C, ssm_state=pool, rows=rows, D=D)
    assert not hopper.supports(x, dt, A, B, C, pool, rows, D=D, algorithm="parallel")
    assert not hopper.supports(*_args(head_dim=48), D=D)


def test_the_op_refuses_what_it_does_not_fit():
    with pytest.raises(ValueError, match="P in"):
        hopper.ssd_chunk_scan_hopper(*_args(head_dim=48))


def test_dispatch_runs_the_hopper_kernel_where_it_applies(monkeypatch):
    calls = []

    def kernel(x, *, interpret):
        calls.append(("triton", interpret))

    def hopper_kernel(x):
        calls.append(("hopper", x))

    def reference(x):
        calls.append(("reference",))

    op = _dispatch.dispatched(
        kernel, reference, _dispatch.HopperKernel(lambda x: x > 0, hopper_kernel)
    )
    monkeypatch.delenv("JMAMBA_KERNELS", raising=False)
    op(1, implementation="pallas")
    op(0, implementation="pallas")
    op(1, implementation="triton")
    op(1, implementation="interpret")
    op(1, implementation="reference")
    triton = [("triton", False), ("triton", False), ("triton", True)]
    assert calls == [("hopper", 1), *triton, ("reference",)]


def test_a_call_without_D_goes_to_the_triton_kernel(monkeypatch):
    """Without D the Mosaic kernel would take a constant operand, which Mosaic GPU refuses
    unless XLA happens to align it (see `_hopper.boundary_operands`)."""
    monkeypatch.setattr(hopper, "on_hopper", lambda: True)
    x, dt, A, B, C, pool, rows = _args()
    assert not hopper.supports(x, dt, A, B, C, pool, rows)
    with pytest.raises(ValueError, match="takes D"):
        hopper.ssd_chunk_scan_hopper(x, dt, A, B, C, pool, rows)
