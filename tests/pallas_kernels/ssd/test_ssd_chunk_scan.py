"""ssd_chunk_scan: reference and kernel (interpret) against a naive numpy token loop."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from pallas_kernels import ops
from pallas_kernels.rows import Rows
from pallas_kernels.ssd.chunk_scan import ScanTuning, ssd_chunk_scan

ARGS = ("x", "dt", "A", "B", "C", "ssm_state")
ROWS = ("query_start_loc", "num_computed", "has_initial_state", "read_slots", "write_slots")
OPTS = ("D", "z", "dt_bias")


def rows_of(d: dict, block_size=None, boundary_slots=None) -> Rows:
    """The `Rows` of an input dict (its ROWS fields), with boundary slots when given."""
    return Rows(*(d[k] for k in ROWS), boundary_slots=boundary_slots, block_size=block_size)


def _softplus(v):
    return np.log1p(np.exp(-np.abs(v))) + np.maximum(v, 0)


def oracle(d: dict, dt_softplus=True, dt_limit=(0.0, np.inf), block_size=None, boundary=None):
    """The contract's definition, head by head and token by token, in float64."""
    x, dt, a = d["x"].astype(np.float64), d["dt"].astype(np.float64), d["A"].astype(np.float64)
    bm, cm = d["B"].astype(np.float64), d["C"].astype(np.float64)
    src = d["ssm_state"].astype(np.float64)
    pool, y = src.copy(), np.zeros(x.shape)
    qsl, heads, groups = d["query_start_loc"], x.shape[1], bm.shape[1]
    for r in range(len(qsl) - 1):
        slot = d["read_slots"][r]
        init = src[slot] if (d["has_initial_state"][r] and slot > 0) else np.zeros(src.shape[1:])
        s = init.copy()
        for i, t in enumerate(range(qsl[r], qsl[r + 1])):
            for h in range(heads):
                g = h // (heads // groups)
                dth = dt[t, h] + (0 if d.get("dt_bias") is None else d["dt_bias"][h])
                dth = np.clip(_softplus(dth) if dt_softplus else dth, *dt_limit)
                s[h] = s[h] * np.exp(dth * a[h]) + dth * np.outer(x[t, h], bm[t, g])
                y[t, h] = s[h] @ cm[t, g] + (0 if d.get("D") is None else d["D"][h] * x[t, h])
                if d.get("z") is not None:
                    zz = d["z"][t, h].astype(np.float64)
                    y[t, h] *= zz / (1 + np.exp(-zz))
            pos = d["num_computed"][r] + i
            if block_size and (pos + 1) % block_size == 0:
                j = (pos + 1) // block_size - d["num_computed"][r] // block_size - 1
                if j < boundary.shape[1] and boundary[r, j] > 0:
                    pool[boundary[r, j]] = s
        if d["write_slots"][r] > 0:
            pool[d["write_slots"][r]] = s
    return y, pool


def make_inputs(
    seed,
    lengths,
    heads=4,
    head_dim=6,
    groups=2,
    state=5,
    pad=3,
    slots=None,
    num_computed=None,
    gate=True,
):
    """Rows of the given lengths, one empty padding row, `pad` padding tokens."""
    rng = np.random.default_rng(seed)
    nrows = len(lengths) + 1
    slots = slots or 2 * nrows + 3
    qsl = np.concatenate([[0], np.cumsum(list(lengths) + [0])]).astype(np.int32)
    num_tokens = int(qsl[-1]) + pad
    perm = rng.permutation(np.arange(1, slots))
    read, write = perm[:nrows].astype(np.int32), perm[nrows : 2 * nrows].astype(np.int32)
    read[-1] = write[-1] = 0
    has_init = rng.random(nrows) < 0.6
    has_init[-1] = False
    if num_computed is None:
        num_computed = np.where(has_init, rng.integers(1, 40, nrows), 0)
    f32 = np.float32
    d = dict(
        x=rng.standard_normal((num_tokens, heads, head_dim)).astype(f32),
        dt=rng.standard_normal((num_tokens, heads)).astype(f32) - 1.0,
        A=-np.exp(rng.standard_normal(heads)).astype(f32),
        B=rng.standard_normal((num_tokens, groups, state)).astype(f32),
        C=rng.standard_normal((num_tokens, groups, state)).astype(f32),
        ssm_state=rng.standard_normal((slots, heads, head_dim, state)).astype(f32),
        query_start_loc=qsl,
        num_computed=np.asarray(num_computed, np.int32),
        has_initial_state=has_init,
        read_slots=read,
        write_slots=write,
        D=rng.standard_normal(heads).astype(f32),
        dt_bias=rng.standard_normal(heads).astype(f32) * 0.5,
    )
    if gate:
        d["z"] = rng.standard_normal((num_tokens, heads, head_dim)).astype(f32)
    return d


def run(d: dict, implementation: str, block_size=None, boundary_slots=None, **kw):
    opts = {k: d[k] for k in OPTS if k in d}
    rows = rows_of(d, block_size, boundary_slots)
    return ops.ssd_chunk_scan(
        *[d[k] for k in ARGS], rows, **opts, **kw, implementation=implementation
    )


def check(d: dict, implementation: str, tol=2e-4, boundary=None, block_size=None, **kw):
    want_y, want_pool = oracle(
        d, kw.get("dt_softplus", True), kw.get("dt_limit", (0.0, np.inf)), block_size, boundary
    )
    if boundary is not None:
        kw = {**kw, "boundary_slots": boundary, "block_size": block_size}
    y, pool = run(d, implementation, **kw)
    np.testing.assert_allclose(np.asarray(y), want_y, rtol=tol, atol=tol)
    np.testing.assert_allclose(np.asarray(pool), want_pool, rtol=tol, atol=tol)


@pytest.mark.parametrize("lengths", [(7, 1, 13, 2), (1,), (0, 20)])
def test_reference_matches_oracle(lengths):
    check(make_inputs(0, lengths), "reference", chunk_size=8)


def test_reference_dt_options():
    d = make_inputs(1, (9, 4), gate=False)
    d.pop("dt_bias")
    check(d, "reference", dt_softplus=False, dt_limit=(0.01, 0.5), chunk_size=8)


def test_reference_boundary_states():
    d = make_inputs(2, (13, 6, 20), num_computed=[5, 0, 8, 0], slots=24)
    free = sorted(set(range(1, 24)) - set(d["read_slots"]) - set(d["write_slots"]))
    boundary = np.array(free[:12], np.int32).reshape(4, 3)
    boundary[0, 2] = boundary[3] = 0
    check(d, "reference", chunk_size=4, block_size=8, boundary=boundary)


def test_rejects_bad_block_size():
    d = make_inputs(0, (3,))
    with pytest.raises(ValueError, match="block_size"):
        run(d, "reference", chunk_size=8, block_size=12, boundary_slots=np.zeros((2, 1), np.int32))


@pytest.mark.parametrize("algorithm", ["sequential", "parallel"])
@pytest.mark.parametrize(
    ("lengths", "nc", "heads", "head_dim", "groups", "state", "kw"),
    [
        # several rows in one chunk, lengths not multiples
        ((7, 1, 13, 2), None, 4, 6, 2, 5, {}),
        ((1,), [0, 0], 2, 16, 1, 16, {}),  # a single token
        # an empty row; starts mid-chunk, spans chunks of 2 token blocks (output loop over blocks)
        ((0, 70), [3, 21, 0], 4, 6, 4, 5, {"chunk_size": 32, "tuning": ScanTuning(block_q=16)}),
        # odd head counts, head dims and state sizes beside a multi-block head dim
        ((17, 3), [5, 0, 0], 5, 12, 1, 24, {}),
        ((16, 33), [0, 15, 0], 6, 80, 3, 48, {}),
    ],
)
def test_kernel_matches_oracle(algorithm, lengths, nc, heads, head_dim, groups, state, kw):
    d = make_inputs(7, lengths, heads, head_dim, groups, state, num_computed=nc)
    check(d, "interpret", **{"chunk_size": 16, **kw, "algorithm": algorithm})


@pytest.mark.parametrize("algorithm", ["sequential", "parallel"])
def test_kernel_short_rows_straddling_chunks(algorithm):
    """Eight 2-token rows, each across a chunk boundary: 16 chunks for 16 tokens (the parallel
    kernel's chunk table once held cdiv(T, chunk) + R = 9 and left outputs unwritten)."""
    d = make_inputs(9, [2] * 8, num_computed=[15] * 8 + [0], pad=0)
    check(d, "interpret", chunk_size=16, algorithm=algorithm)


@pytest.mark.parametrize(("block_k", "heads_per_program"), [(None, 1), (16, 3)])
def test_kernel_cb_blocks_shared_by_a_group(block_k, heads_per_program):
    """Three heads per group read one C B^T per chunk, computed in 2 x 2 blocks of 32 tokens and
    read in k-tiles of 32 or 16 tokens, by one program per head or one for the group's three;
    rows start mid-chunk and run past it."""
    d = make_inputs(7, (9, 70), 6, 6, 2, 5, num_computed=[3, 21, 0])
    tuning = ScanTuning(
        block_q=32, block_k=block_k, pass_stages=2, heads_per_program=heads_per_program
    )
    check(d, "interpret", chunk_size=64, tuning=tuning, algorithm="parallel")


def test_kernel_state_chunk_divides_chunk_size():
    d = make_inputs(3, (37, 5), num_computed=[30, 0, 0])
    tuning = ScanTuning(state_chunk=32, block_q=16)
    check(d, "interpret", chunk_size=64, tuning=tuning, algorithm="parallel")


def test_kernel_steep_decay():
    """Decay of ~90 nats a token: a chunk's cumulative log decay reaches thousands, so any factor
    exp(-cum) (a decay split into a row and a column part) overflows; the parallel output kernel
    splits the decay of the tokens before a block at the block's start, both parts <= 1; the
    chunk-state kernel's steps of 32 tokens rescale its sum by each step's decay (<= 1)."""
    d = make_inputs(5, (70, 9), num_computed=[3, 0, 0], gate=False)
    d["dt"] = d["dt"] + 4.0
    d["A"] = np.full_like(d["A"], -30.0)
    tuning = ScanTuning(block_q=16, block_k=16, heads_per_program=2, state_block_q=32)
    check(d, "interpret", chunk_size=64, tuning=tuning, algorithm="parallel")


def test_rejects_unknown_algorithm():
    d = make_inputs(0, (3,))
    for implementation in ("reference", "interpret"):
        with pytest.raises(ValueError, match="algorithm='auto'"):
            run(d, implementation, chunk_size=8, algorithm="auto")


@pytest.mark.parametrize("algorithm", ["parallel", "sequential"])
def test_kernel_lowers_for_triton(algorithm):
    """The Pallas -> Triton lowering (no PTX compile) at the benchmark's head shape."""
    from pallas_kernels._common import lower_for_cuda

    sds = jax.ShapeDtypeStruct
    bf, f32, i32 = jnp.bfloat16, jnp.float32, jnp.int32
    t, h, p, g, n, r = 600, 8, 64, 2, 128, 3
    args = (
        sds((t, h, p), bf),
        sds((t, h), bf),
        sds((h,), f32),
        sds((t, g, n), bf),
        sds((t, g, n), bf),
        sds((5, h, p, n), f32),
        sds((r + 1,), i32),
        sds((r,), i32),
        sds((r,), jnp.bool_),
        sds((r,), i32),
        sds((r,), i32),
    )
    opts = (sds((h,), f32), sds((t, h, p), bf), sds((h,), f32), sds((r, 2), i32))

    def fn(*a):
        d, z, bias, bnd = a[11:]
        rows = Rows(*a[6:11], boundary_slots=bnd, block_size=512)
        kw = dict(D=d, z=z, dt_bias=bias, algorithm=algorithm)
        return ssd_chunk_scan(*a[:6], rows, **kw, interpret=False)

    text = lower_for_cuda(fn, *args, *opts)
    names = ("ssd_chunk_state", "ssd_state_pass", "ssd_chunk_cb", "ssd_chunk_output")
    for name in names if algorithm == "parallel" else ("ssd_chunk_scan_sequential",):
        assert name in text


def test_kernel_garbage_slot_without_initial_state_and_dt_options():
    d = make_inputs(8, (9, 5), gate=False)
    d["has_initial_state"][:] = False  # the read slots hold random garbage: must read zeros
    d.pop("dt_bias")
    for algorithm in ("sequential", "parallel"):
        kw = dict(chunk_size=16, dt_softplus=False, dt_limit=(0.01, 0.5), algorithm=algorithm)
        check(d, "interpret", **kw)


@pytest.mark.parametrize("algorithm", ["parallel", "sequential"])
def test_kernel_boundary_states(algorithm):
    d = make_inputs(2, (13, 6, 20), num_computed=[5, 0, 8, 0], slots=24)
    free = sorted(set(range(1, 24)) - set(d["read_slots"]) - set(d["write_slots"]))
    boundary = np.array(free[:12], np.int32).reshape(4, 3)
    boundary[0, 2] = boundary[3] = 0
    check(d, "interpret", chunk_size=16, block_size=16, boundary=boundary, algorithm=algorithm)
