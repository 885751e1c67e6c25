"""The Mosaic GPU Gated DeltaNet chain (`gdn/chain_mgpu.py`) on CPU: what can be checked without
an sm_90.

Its math runs on the GPU only (Mosaic GPU's interpret mode does not run wgmma): gpu_checks.py's
`gdn_chunk hopper` grid points compare it with the reference there, and
`test_full_grid_lowers_for_the_gpu` lowers them for CUDA here. This file checks the XLA side (each
chunk's summed log decay) against a loop written from the definition, when the kernel applies,
and that the models' op lowers to it on Hopper.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from pallas_kernels import ops
from pallas_kernels._common import lower_for_cuda
from pallas_kernels.gdn import chain_mgpu as hopper
from pallas_kernels.gdn.chunk import chunk_tiles
from pallas_kernels.rows import Rows


def _chunk_sums_by_loop(lengths, computed, g):
    """Per chunk, in call order: the sum of g over its tokens, chunks ending where a row's absolute
    position reaches a multiple of Q."""
    out, start = [], 0
    for length, pos in zip(lengths, computed, strict=True):
        t, end = start, start + length
        while t < end:
            n = min(end - t, hopper.Q - pos % hopper.Q)
            out.append(g[t : t + n].sum(axis=0))
            t, pos = t + n, pos + n
        start = end
    return np.array(out)


@pytest.mark.parametrize(
    "lengths, computed, tokens",
    [((100, 70, 0, 80), (0, 62, 5, 0), 300), ((1, 64, 65, 129), (63, 0, 64, 7), 270)],
)
def test_chunk_totals_sum_each_chunks_own_tokens(lengths, computed, tokens):
    rng = np.random.default_rng(0)
    g = -np.abs(rng.standard_normal((tokens, 3))).astype(np.float32)
    qsl = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)
    cstart, clen, _, _ = chunk_tiles(
        jnp.asarray(qsl), jnp.asarray(computed, jnp.int32), tokens, hopper.Q
    )
    totals = np.asarray(hopper.chunk_totals(jnp.asarray(g), cstart, clen))
    want = _chunk_sums_by_loop(lengths, computed, g)
    np.testing.assert_allclose(totals[: len(want)], want, rtol=1e-5, atol=1e-6)
    assert not totals[len(want) :].any()  # table entries past the call's chunks hold no token


def _args(k_dim=128, v_dim=128, dtype=jnp.bfloat16, pool_dtype=jnp.float32, t=70):
    hk, hv = 2, 4
    rows = Rows(
        jnp.array([0, t], jnp.int32),
        jnp.zeros(1, jnp.int32),
        jnp.zeros(1, bool),
        jnp.zeros(1, jnp.int32),
        jnp.ones(1, jnp.int32),
    )
    return (
        jnp.zeros((t, hk, k_dim), dtype),
        jnp.zeros((t, hk, k_dim), dtype),
        jnp.zeros((t, hv, v_dim), dtype),
        jnp.zeros((t, hv), jnp.float32),
        jnp.zeros((t, hv), jnp.float32),
        jnp.zeros((3, hv, v_dim, k_dim), pool_dtype),
        rows,
    )


def _fits(args, chunk_size=64):
    q, k, v, _, _, pool, _ = args
    return hopper.fits(q, k, v, pool, chunk_size)


def test_fits_names_the_shapes_it_takes_and_supports_needs_an_sm90():
    assert _fits(_args()) and _fits(_args(k_dim=64, v_dim=192))
    assert not _fits(_args(), chunk_size=128)  # chunks of Q tokens only
    for bad in (
        _args(k_dim=96),
        _args(v_dim=96),
        _args(dtype=jnp.float32),
        _args(pool_dtype=jnp.bfloat16),
    ):
        assert not _fits(bad)
    assert not hopper.supports(*_args())  # this machine is no sm_90


def test_supports_reads_the_call_as_the_op_takes_it(monkeypatch):
    monkeypatch.setattr(hopper, "on_hopper", lambda: True)
    q, k, v, g, beta, pool, rows = _args()
    assert hopper.supports(q, k, v, g, beta, pool, rows)
    assert hopper.supports(q, k, v, g, beta, state=pool, rows=rows, scale=0.5)
    assert not hopper.supports(q, k, v, g, beta, pool, rows, chunk_size=128)
    assert not hopper.supports(*_args(v_dim=96))


def test_the_op_refuses_what_it_does_not_fit():
    with pytest.raises(ValueError, match="V a multiple of"):
        hopper.gdn_chunk_hopper(*_args(v_dim=96))


def test_the_models_op_lowers_to_the_mosaic_chain_on_hopper(monkeypatch):
    """`ops.gdn_chunk` (what the Gated DeltaNet mixer calls) picks the Mosaic GPU chain for a bf16
    call on an sm_90, and the Triton chain for an fp32 one."""
    monkeypatch.setattr(hopper, "on_hopper", lambda: True)
    op = functools.partial(ops.gdn_chunk, implementation="pallas")
    abstract = jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype), _args(t=130))
    assert "mosaic_gpu" in lower_for_cuda(op, *abstract)
    fp32 = jax.tree.map(
        lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype), _args(t=130, dtype=jnp.float32)
    )
    assert "mosaic_gpu" not in lower_for_cuda(op, *fp32)
