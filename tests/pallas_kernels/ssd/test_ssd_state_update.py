"""ssd_state_update: reference and kernel (interpret) against a naive numpy loop."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest

from pallas_kernels import ops

ARGS = ("x", "dt", "A", "B", "C", "ssm_state", "read_slots", "write_slots")
OPTS = ("D", "z", "dt_bias")


def _softplus(v):
    return np.log1p(np.exp(-np.abs(v))) + np.maximum(v, 0)


def oracle(d: dict, dt_softplus=True, dt_limit=(0.0, np.inf)):
    """Row by row, lane by lane, head by head, in float64."""
    x, dt, a = d["x"].astype(np.float64), d["dt"].astype(np.float64), d["A"].astype(np.float64)
    bm, cm = d["B"].astype(np.float64), d["C"].astype(np.float64)
    src = d["ssm_state"].astype(np.float64)
    pool, y = src.copy(), np.zeros(x.shape)
    batch, lanes, heads, _ = x.shape
    groups = bm.shape[2]
    for b in range(batch):
        s = src[d["read_slots"][b]].copy() if d["read_slots"][b] > 0 else np.zeros(src.shape[1:])
        for t in range(lanes):
            for h in range(heads):
                g = h // (heads // groups)
                dth = dt[b, t, h] + (0 if d.get("dt_bias") is None else d["dt_bias"][h])
                dth = np.clip(_softplus(dth) if dt_softplus else dth, *dt_limit)
                s[h] = s[h] * np.exp(dth * a[h]) + dth * np.outer(x[b, t, h], bm[b, t, g])
                y[b, t, h] = s[h] @ cm[b, t, g]
                y[b, t, h] += 0 if d.get("D") is None else d["D"][h] * x[b, t, h]
                if d.get("z") is not None:
                    zz = d["z"][b, t, h].astype(np.float64)
                    y[b, t, h] *= zz / (1 + np.exp(-zz))
            slot = d["write_slots"][b, t]
            if slot > 0:
                pool[slot] = s
            else:
                y[b, t] = 0.0
    return y, pool


def make_inputs(seed, batch, lanes, heads=4, head_dim=6, groups=2, state=5, gate=True):
    """A padding row (last) and, with several lanes, a dead lane in row 0."""
    rng = np.random.default_rng(seed)
    slots = batch * (lanes + 1) + 2
    perm = rng.permutation(np.arange(1, slots))
    read = perm[:batch].astype(np.int32)
    write = perm[batch : batch + batch * lanes].reshape(batch, lanes).astype(np.int32)
    if lanes == 1:
        write[0, 0] = read[0]  # in place, the K = 0 case
    read[-1] = 0
    write[-1] = 0
    if lanes > 1:
        write[0, -1] = 0
    f32 = np.float32
    d = dict(
        x=rng.standard_normal((batch, lanes, heads, head_dim)).astype(f32),
        dt=rng.standard_normal((batch, lanes, heads)).astype(f32) - 1.0,
        A=-np.exp(rng.standard_normal(heads)).astype(f32),
        B=rng.standard_normal((batch, lanes, groups, state)).astype(f32),
        C=rng.standard_normal((batch, lanes, groups, state)).astype(f32),
        ssm_state=rng.standard_normal((slots, heads, head_dim, state)).astype(f32),
        read_slots=read,
        write_slots=write,
        D=rng.standard_normal(heads).astype(f32),
        dt_bias=rng.standard_normal(heads).astype(f32) * 0.5,
    )
    if gate:
        d["z"] = rng.standard_normal((batch, lanes, heads, head_dim)).astype(f32)
    return d


def run(d: dict, implementation: str, **kw):
    opts = {k: d[k] for k in OPTS if k in d}
    return ops.ssd_state_update(*[d[k] for k in ARGS], **opts, **kw, implementation=implementation)


def check(d: dict, implementation: str, tol=2e-5, **kw):
    want_y, want_pool = oracle(d, kw.get("dt_softplus", True), kw.get("dt_limit", (0.0, np.inf)))
    y, pool = run(d, implementation, **kw)
    np.testing.assert_allclose(np.asarray(y), want_y, rtol=tol, atol=tol)
    np.testing.assert_allclose(np.asarray(pool), want_pool, rtol=tol, atol=tol)


@pytest.mark.parametrize("lanes", [1, 2, 4])
def test_reference_matches_oracle(lanes):
    check(make_inputs(0, 3, lanes), "reference")


def test_reference_dt_options():
    d = make_inputs(1, 2, 2, gate=False)
    d.pop("dt_bias")
    check(d, "reference", dt_softplus=False, dt_limit=(0.01, 0.5))


def test_rejects_bad_groups():
    d = make_inputs(0, 2, 1, groups=2)
    d["B"] = d["C"] = d["B"][:, :, :1].repeat(3, axis=2)
    with pytest.raises(ValueError, match="groups"):
        run(d, "reference")


@pytest.mark.parametrize(
    ("batch", "lanes", "heads", "head_dim", "groups", "state"),
    [
        (3, 1, 4, 6, 2, 5),
        (2, 2, 4, 6, 2, 5),
        (3, 3, 2, 16, 1, 16),
        (2, 4, 4, 6, 2, 5),
        (2, 2, 5, 12, 1, 24),
        (2, 3, 6, 80, 3, 48),
    ],
)
def test_kernel_matches_oracle(batch, lanes, heads, head_dim, groups, state):
    """K = 0..3 speculative lanes, head dims and state sizes that are not powers of two."""
    check(make_inputs(2, batch, lanes, heads, head_dim, groups, state), "interpret")


def test_kernel_dt_options_and_bf16():
    d = make_inputs(3, 2, 2, gate=False)
    d.pop("dt_bias")
    check(d, "interpret", dt_softplus=False, dt_limit=(0.01, 0.5))
    d = make_inputs(4, 2, 2)
    d["x"] = d["x"].astype(jnp.bfloat16)
    want_y, want_pool = oracle({**d, "x": np.asarray(d["x"], np.float32)})
    y, pool = run(d, "interpret")
    assert y.dtype == jnp.bfloat16
    np.testing.assert_allclose(np.asarray(y, np.float32), want_y, rtol=2e-2, atol=2e-2)
    np.testing.assert_allclose(np.asarray(pool), want_pool, rtol=1e-5, atol=1e-5)
