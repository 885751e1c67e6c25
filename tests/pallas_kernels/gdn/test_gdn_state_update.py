"""Gated DeltaNet decode (gating fused): jnp reference vs fp64 oracle (and the kernel)."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from pallas_kernels.gdn import reference as ref
from pallas_kernels.gdn.state_update import gdn_state_update

from . import gdn_oracle
from .gdn_oracle import lower_for_cuda

HK, HV, K, V = 2, 4, 16, 16


def make_case(B, L, *, seed=0, pad_rows=(), dead=(), dims=(HK, HV, K, V)):
    """numpy decode inputs; row b reads slot 1 + b, lane t writes its own slot; NaN in slot 0.

    dims = (HK, HV, K, V): key heads, value heads, key and value head dims."""
    HK, HV, K, V = dims
    rng = np.random.default_rng(seed)
    f = lambda *s: rng.standard_normal(s).astype(np.float32)  # noqa: E731
    S = 2 + B * (L + 1)
    state = f(S, HV, V, K)
    state[0] = np.nan
    rs = np.arange(1, B + 1, dtype=np.int32)
    ws = (B + 1 + np.arange(B * L, dtype=np.int32)).reshape(B, L)
    if L == 1:
        ws[:, 0] = rs  # K = 0: in place
    for b in pad_rows:
        rs[b] = 0
        ws[b] = 0
    for b, t in dead:
        ws[b, t] = 0
    args = [
        f(B, L, HK, K),
        f(B, L, HK, K),
        f(B, L, HV, V),
        f(B, L, HV),
        f(B, L, HV),
        f(HV) * 0.5,
        f(HV),
        state,
        rs,
        ws,
    ]
    return args


def check(o, st, args, tol=2e-4):
    o_ref, st_ref = gdn_oracle.decode(*args)
    np.testing.assert_allclose(np.asarray(o), o_ref, rtol=tol, atol=tol)
    st = np.asarray(st)
    assert np.isnan(st[0]).all()
    np.testing.assert_allclose(st[1:], st_ref[1:], rtol=tol, atol=tol)


_ref = jax.jit(ref.gdn_state_update_reference)


@pytest.mark.parametrize("L", [1, 2, 3, 4])
def test_reference_matches_oracle(L):
    args = make_case(3, L, seed=L, pad_rows=(1,), dead=((2, L - 1),))
    o, st = _ref(*map(jnp.asarray, args))
    check(o, st, args)


def test_bad_shapes_raise():
    args = make_case(2, 1)
    args[3] = args[3][:, :, :3]
    with pytest.raises(ValueError, match="a has shape"):
        ref.gdn_state_update_reference(*map(jnp.asarray, args))


@pytest.mark.parametrize("L", [1, 2, 3, 4])
def test_kernel_interpret(L):
    """K = L - 1 draft tokens; padding row, dead lane; NaN in slot 0 never leaks."""
    args = make_case(3, L, seed=10 + L, pad_rows=(0,), dead=((1, L - 1),))
    fn = jax.jit(functools.partial(gdn_state_update, interpret=True, block_v=8))
    o, st = fn(*map(jnp.asarray, args))
    check(o, st, args)


@pytest.mark.parametrize("dims", [(1, 5, 24, 12), (3, 6, 48, 20)])
def test_kernel_interpret_odd_dims(dims):
    """Head dims that are not powers of two, odd head counts, two lanes."""
    args = make_case(3, 2, seed=4, pad_rows=(2,), dead=((0, 1),), dims=dims)
    o, st = jax.jit(functools.partial(gdn_state_update, interpret=True, block_v=8))(
        *map(jnp.asarray, args)
    )
    check(o, st, args)


def test_kernel_lowers_for_triton():
    args = [jnp.asarray(x) for x in make_case(2, 2)]
    text = lower_for_cuda(functools.partial(gdn_state_update, interpret=False), *args)
    assert "triton" in text
