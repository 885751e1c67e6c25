"""gdn_decode: the fused kernel (interpret) against the unfused references, the reference against
the float64 numpy oracles of the conv update and the gated delta rule, on odd shapes."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest

from pallas_kernels import ops
from tests.pallas_kernels.conv import test_causal_conv1d as conv
from tests.pallas_kernels.ssd.test_mamba2_decode import assert_pools_and_outputs

from . import gdn_oracle

ARGS = (
    "mixed",
    "conv_weight",
    "conv_bias",
    "conv_state",
    "state",
    "A_log",
    "dt_bias",
    "read_slots",
    "write_slots",
)


def make_inputs(
    seed,
    batch,
    lanes,
    k_heads=2,
    v_heads=6,
    k_dim=24,
    v_dim=12,
    width=4,
    dtype=jnp.float32,
    bias=False,
) -> dict:
    """Rows as in test_mamba2_decode.make_inputs: 0 in place at lane 0, 1 with a dead last lane,
    2 reading NULL, the last padding; random pools with NaN in slot 0."""
    rng = np.random.default_rng(seed)
    slots = batch * (lanes + 1) + 3
    perm = rng.permutation(np.arange(1, slots)).astype(np.int32)
    read = perm[:batch].copy()
    write = perm[batch : batch + batch * lanes].reshape(batch, lanes).copy()
    write[0, 0] = read[0]
    if lanes > 1:
        write[1, -1] = 0
    if batch > 3:
        read[2] = 0
    read[-1], write[-1] = 0, 0
    value_dim = v_heads * v_dim
    conv_dim = 2 * k_heads * k_dim + value_dim
    f32 = np.float32
    conv_state = rng.standard_normal((slots, conv_dim, width - 1)).astype(f32)
    state = rng.standard_normal((slots, v_heads, v_dim, k_dim)).astype(f32)
    conv_state[0] = state[0] = np.nan
    mixed = rng.standard_normal((batch, lanes, conv_dim + value_dim + 2 * v_heads)).astype(f32)
    return dict(
        mixed=np.array(jnp.asarray(mixed, dtype)),
        conv_weight=rng.standard_normal((conv_dim, width)).astype(f32) * width**-0.5,
        conv_bias=rng.standard_normal(conv_dim).astype(f32) * 0.1 if bias else None,
        conv_state=np.array(jnp.asarray(conv_state, dtype)),
        state=state,
        A_log=rng.standard_normal(v_heads).astype(f32) * 0.5,
        dt_bias=rng.standard_normal(v_heads).astype(f32),
        read_slots=read,
        write_slots=write,
    )


def run(d: dict, implementation: str, **kw):
    return ops.gdn_decode(*(d[k] for k in ARGS), **kw, implementation=implementation)


def oracle(d: dict, k_heads: int, k_dim: int):
    """The conv-update oracle, the split, then the delta-rule oracle, all in float64."""
    mixed = d["mixed"].astype(np.float64)
    conv_dim, key_dim = d["conv_weight"].shape[0], k_heads * k_dim
    v_heads = d["state"].shape[1]
    qkv, conv_pool = conv.oracle_update(
        mixed[..., :conv_dim],
        d["conv_weight"],
        d["conv_bias"],
        d["conv_state"].astype(np.float64),
        d["read_slots"],
        d["write_slots"],
        "silu",
    )
    lead = qkv.shape[:2]
    q, k, v = np.split(qkv, [key_dim, 2 * key_dim], axis=-1)
    gates = mixed[..., conv_dim + (conv_dim - 2 * key_dim) :]  # [b | a], after qkv and z
    o, pool = gdn_oracle.decode(
        q.reshape(*lead, k_heads, k_dim),
        k.reshape(*lead, k_heads, k_dim),
        v.reshape(*lead, v_heads, -1),
        gates[..., v_heads:],
        gates[..., :v_heads],
        d["A_log"],
        d["dt_bias"],
        d["state"],
        d["read_slots"],
        d["write_slots"],
    )
    return o, conv_pool, pool


def check_against_reference(d: dict, tol: float, **kw):
    got = [np.asarray(a) for a in run(d, "interpret", **kw)]
    want = [np.asarray(a) for a in run(d, "reference", **kw)]
    assert_pools_and_outputs(d, got, want, ("conv_state", "state"), tol)


@pytest.mark.parametrize(
    ("batch", "lanes", "k_heads", "v_heads", "k_dim", "v_dim", "width"),
    [
        (4, 1, 1, 5, 24, 12, 4),
        (4, 2, 2, 6, 16, 24, 3),
        (5, 3, 3, 6, 12, 80, 2),
        (4, 4, 1, 5, 80, 12, 4),
        (3, 1, 2, 6, 24, 24, 2),
    ],
)
def test_kernel_matches_unfused_reference(batch, lanes, k_heads, v_heads, k_dim, v_dim, width):
    d = make_inputs(batch * 10 + lanes, batch, lanes, k_heads, v_heads, k_dim, v_dim, width)
    check_against_reference(d, tol=2e-6)


def test_kernel_bf16_bias_and_options():
    """bf16 in_proj output and conv pool, a conv bias, small blocks, a given scale, no l2norm."""
    d = make_inputs(7, 4, 2, 2, 6, 24, 12, 4, dtype=jnp.bfloat16, bias=True)
    check_against_reference(d, tol=1e-2)
    d = make_inputs(8, 4, 2, 2, 6, 24, 40, 3, bias=True)
    kw = dict(scale=0.3, use_qk_l2norm=False)
    got = run(d, "interpret", block_v=8, block_c=32, **kw)
    for a, b in zip(got, run(d, "reference", **kw), strict=True):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=2e-5, atol=2e-5)


@pytest.mark.parametrize("lanes", [1, 3])
def test_reference_matches_oracles(lanes):
    d = make_inputs(9, 4, lanes, 2, 6, 16, 12, 4, bias=True)
    for got, want in zip(run(d, "reference"), oracle(d, 2, 16), strict=True):
        np.testing.assert_allclose(np.asarray(got), want, rtol=2e-5, atol=2e-5)


@pytest.mark.parametrize("implementation", ["interpret", "reference"])
def test_out_of_range_slots_act_as_null(implementation):
    """Ids past the pool or negative read zeros and write nothing, bitwise like NULL."""
    d = make_inputs(11, 4, 2)
    num_slots = d["state"].shape[0]
    bad = {**d, "read_slots": d["read_slots"].copy(), "write_slots": d["write_slots"].copy()}
    null = {**d, "read_slots": d["read_slots"].copy(), "write_slots": d["write_slots"].copy()}
    edits = [
        ("read_slots", (1,)),
        ("write_slots", (2, 0)),
        ("write_slots", (2, 1)),
        ("read_slots", (0,)),
    ]
    ids = [num_slots, num_slots + 5, -1, -num_slots + 1]
    for (name, index), value in zip(edits, ids, strict=True):
        bad[name][index], null[name][index] = value, 0
    for got, want in zip(run(bad, implementation), run(null, implementation), strict=True):
        assert np.asarray(got).tobytes() == np.asarray(want).tobytes()


def test_rejects_bad_shapes():
    d = make_inputs(12, 2, 1, 2, 6, 16, 12, 4)  # conv_dim 2*32 + 72 = 136
    with pytest.raises(ValueError, match="conv_weight has 128 channels"):
        run({**d, "conv_weight": d["conv_weight"][:-8]}, "reference")
    with pytest.raises(ValueError, match="key heads; must divide HV=6"):
        run(
            {**d, "conv_weight": np.concatenate([d["conv_weight"], d["conv_weight"][:64]])},
            "reference",
        )
    with pytest.raises(ValueError, match="mixed has shape"):
        run({**d, "mixed": d["mixed"][..., :-1]}, "interpret")
    with pytest.raises(ValueError, match="conv_state has shape"):
        run({**d, "conv_state": d["conv_state"][1:]}, "interpret")
