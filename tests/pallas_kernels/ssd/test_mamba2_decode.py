"""mamba2_decode: the fused kernel (interpret) against the unfused references, the reference against
the float64 numpy oracles of the conv update and the state update, on odd shapes."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest

from pallas_kernels import ops
from tests.pallas_kernels.conv import test_causal_conv1d as conv

from . import test_ssd_state_update as ssu

ARGS = (
    "zxbcdt",
    "conv_weight",
    "conv_bias",
    "conv_state",
    "ssm_state",
    "A",
    "read_slots",
    "write_slots",
)
OPTS = ("D", "dt_bias")


def make_inputs(
    seed,
    batch,
    lanes,
    heads=6,
    head_dim=12,
    groups=3,
    state=16,
    width=4,
    dtype=jnp.float32,
    slots=None,
) -> dict:
    """Rows: 0 updated in place at lane 0 (the K = 0 case and its speculative form), 1 with a dead
    last lane (when L > 1), 2 reading NULL (zeros) but writing, the last one padding. Every pool
    slot holds random values, slot 0 NaN."""
    rng = np.random.default_rng(seed)
    slots = slots or batch * (lanes + 1) + 3
    perm = rng.permutation(np.arange(1, slots)).astype(np.int32)
    read = perm[:batch].copy()
    write = perm[batch : batch + batch * lanes].reshape(batch, lanes).copy()
    write[0, 0] = read[0]
    if lanes > 1:
        write[1, -1] = 0
    if batch > 3:
        read[2] = 0
    read[-1], write[-1] = 0, 0
    d_inner, bc = heads * head_dim, 2 * groups * state
    conv_dim = d_inner + bc
    f32 = np.float32
    conv_state = rng.standard_normal((slots, conv_dim, width - 1)).astype(f32)
    ssm_state = rng.standard_normal((slots, heads, head_dim, state)).astype(f32)
    conv_state[0] = ssm_state[0] = np.nan
    zxbcdt = rng.standard_normal((batch, lanes, d_inner + conv_dim + heads)).astype(f32)
    zxbcdt[..., -heads:] -= 1.0  # dt around softplus(-1): decays neither 0 nor 1
    return dict(
        zxbcdt=np.array(jnp.asarray(zxbcdt, dtype)),
        conv_weight=rng.standard_normal((conv_dim, width)).astype(f32) * width**-0.5,
        conv_bias=rng.standard_normal(conv_dim).astype(f32) * 0.1,
        conv_state=np.array(jnp.asarray(conv_state, dtype)),
        ssm_state=ssm_state,
        A=-np.exp(rng.standard_normal(heads)).astype(f32),
        read_slots=read,
        write_slots=write,
        D=rng.standard_normal(heads).astype(f32),
        dt_bias=rng.standard_normal(heads).astype(f32) * 0.5,
    )


def run(d: dict, implementation: str, **kw):
    return ops.mamba2_decode(
        *(d[k] for k in ARGS), **{k: d[k] for k in OPTS}, **kw, implementation=implementation
    )


def oracle(d: dict, heads: int, groups: int, state: int):
    """The conv-update oracle, the split, then the state-update oracle, all in float64."""
    zx = d["zxbcdt"].astype(np.float64)
    conv_dim = d["conv_weight"].shape[0]
    d_inner = conv_dim - 2 * groups * state
    xbc, dt = zx[..., d_inner : d_inner + conv_dim], zx[..., d_inner + conv_dim :]
    xbc, conv_pool = conv.oracle_update(
        xbc,
        d["conv_weight"],
        d["conv_bias"],
        d["conv_state"].astype(np.float64),
        d["read_slots"],
        d["write_slots"],
        "silu",
    )
    lead = xbc.shape[:2]
    x, b, c = np.split(xbc, [d_inner, d_inner + groups * state], axis=-1)
    parts = dict(
        x=x.reshape(*lead, heads, -1),
        dt=dt,
        A=d["A"],
        B=b.reshape(*lead, groups, state),
        C=c.reshape(*lead, groups, state),
        ssm_state=d["ssm_state"],
        read_slots=d["read_slots"],
        write_slots=d["write_slots"],
        D=d["D"],
        dt_bias=d["dt_bias"],
    )
    y, ssm_pool = ssu.oracle(parts)
    return y, conv_pool, ssm_pool


def _rel(a, b) -> float:
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-30))


def assert_pools_and_outputs(d: dict, got: list, want: list, pools: tuple[str, str], tol: float):
    """Kernel results `got` vs reference results `want` ([out, pool, pool]): outputs and written
    slots within `tol` (relative norm), padding outputs exactly 0, slot 0 still NaN, every slot
    the call does not write unchanged."""
    y, y_ref = got[0].astype(np.float32), want[0].astype(np.float32)
    live = d["write_slots"] > 0
    assert np.isfinite(y).all() and not y[~live].any(), "padding lanes must output 0"
    assert _rel(y[live], y_ref[live]) <= tol
    written = np.unique(d["write_slots"][live])
    for name, pool, pool_ref in zip(pools, got[1:], want[1:], strict=True):
        pool_in = d[name]
        kept = np.setdiff1d(np.arange(1, pool.shape[0]), written)
        assert np.isnan(np.asarray(pool[0], np.float32)).all()
        assert pool[kept].tobytes() == pool_in[kept].tobytes(), f"{name}: an unwritten slot changed"
        assert _rel(pool[written].astype(np.float32), pool_ref[written].astype(np.float32)) <= tol


def check_against_reference(d: dict, tol: float):
    got = [np.asarray(a) for a in run(d, "interpret")]
    want = [np.asarray(a) for a in run(d, "reference")]
    assert_pools_and_outputs(d, got, want, ("conv_state", "ssm_state"), tol)


@pytest.mark.parametrize(
    ("batch", "lanes", "heads", "head_dim", "groups", "state", "width"),
    [
        (4, 1, 5, 12, 1, 16, 4),
        (4, 2, 6, 24, 3, 24, 3),
        (5, 3, 6, 80, 2, 16, 2),
        (4, 4, 5, 12, 1, 24, 4),
        (3, 1, 6, 24, 2, 24, 2),
        (4, 2, 5, 80, 1, 16, 3),
    ],
)
def test_kernel_matches_unfused_reference(batch, lanes, heads, head_dim, groups, state, width):
    """H 5/6, P 12/24/80, G 1-3, N 16/24, d_conv 2-4, L 1-4: none a power of two in the op's
    channel blocks (B/C channels 2GN = 32..144 beside the x channels)."""
    d = make_inputs(batch * 10 + lanes, batch, lanes, heads, head_dim, groups, state, width)
    check_against_reference(d, tol=2e-6)


def test_kernel_bf16():
    """bf16 in_proj output and conv pool (the served dtypes), fp32 state."""
    d = make_inputs(7, 4, 2, 6, 24, 2, 16, 4, dtype=jnp.bfloat16)
    check_against_reference(d, tol=1e-2)
    y = run(d, "interpret")[0]
    assert y.dtype == jnp.bfloat16


def test_kernel_tuning_blocks():
    """Blocks smaller than the dims (several P blocks per head, several B/C channel blocks)."""
    d = make_inputs(8, 4, 2, 6, 24, 3, 24, 4)
    got = run(d, "interpret", block_p=8, block_c=32)
    want = run(d, "reference")
    for a, b in zip(got, want, strict=True):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=2e-5, atol=2e-5)


@pytest.mark.parametrize("lanes", [1, 3])
def test_reference_matches_oracles(lanes):
    d = make_inputs(9, 4, lanes, 6, 12, 3, 16, 4)
    want = oracle(d, 6, 3, 16)
    for got, w in zip(run(d, "reference"), want, strict=True):
        np.testing.assert_allclose(np.asarray(got), w, rtol=2e-5, atol=2e-5)


def test_kernel_dt_options():
    d = make_inputs(10, 3, 2, 5, 12, 1, 16, 3)
    d["dt_bias"] = None
    kw = dict(dt_softplus=False, dt_limit=(0.01, 0.5))
    d["zxbcdt"][..., -5:] = np.abs(d["zxbcdt"][..., -5:])
    for a, b in zip(run(d, "interpret", **kw), run(d, "reference", **kw), strict=True):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=2e-5, atol=2e-5)


def _bad_ids(num_slots: int) -> list[int]:
    return [num_slots, num_slots + 5, -1, -num_slots + 1]


@pytest.mark.parametrize("implementation", ["interpret", "reference"])
def test_out_of_range_slots_act_as_null(implementation):
    """Ids past the pool or negative read zeros and write nothing, bitwise like NULL."""
    d = make_inputs(11, 4, 2)
    num_slots = d["ssm_state"].shape[0]
    bad, null = dict(d), dict(d)
    bad["read_slots"], null["read_slots"] = d["read_slots"].copy(), d["read_slots"].copy()
    bad["write_slots"], null["write_slots"] = d["write_slots"].copy(), d["write_slots"].copy()
    edits = [
        ("read_slots", (1,)),
        ("write_slots", (2, 0)),
        ("write_slots", (2, 1)),
        ("read_slots", (0,)),
    ]
    for (name, index), value in zip(edits, _bad_ids(num_slots), strict=True):
        bad[name][index], null[name][index] = value, 0
    for got, want in zip(run(bad, implementation), run(null, implementation), strict=True):
        assert np.asarray(got).tobytes() == np.asarray(want).tobytes()


def test_rejects_bad_shapes():
    d = make_inputs(12, 2, 1, 6, 12, 3, 16, 4)
    with pytest.raises(ValueError, match="conv_weight has 152 channels"):
        run({**d, "conv_weight": d["conv_weight"][:-16]}, "reference")
    with pytest.raises(ValueError, match="groups; must divide the 6 heads"):
        run(
            {**d, "conv_weight": np.concatenate([d["conv_weight"]] + [d["conv_weight"][:32]] * 2)},
            "reference",
        )
    with pytest.raises(ValueError, match="zxbcdt has shape"):
        run({**d, "zxbcdt": d["zxbcdt"][..., :-1]}, "interpret")
    with pytest.raises(ValueError, match="write_slots has shape"):
        run({**d, "write_slots": d["write_slots"][:, :0]}, "interpret")
    with pytest.raises(ValueError, match="conv_state has shape"):
        run({**d, "conv_state": d["conv_state"][1:]}, "interpret")
