"""Device gathers are safe without `validate()` (docs/architecture.md section 5).

On the device an out-of-range gather is clamped to the last (live) row and -1 wraps to it. So every
slot, block and kv-slot index is range-checked where it is used: an id outside the pool reads the
NULL entry (zeros) or is dropped. Each test puts out-of-range ids (past the end, and negative) into
the fields of live rows and checks that outputs and pools are bit-identical to the same run with
NULL in those fields, i.e. that no live slot or block was read or written through them.
"""

from __future__ import annotations

import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest

from jmamba.model import rows_or_zeros
from pallas_kernels import ops
from tests.pallas_kernels.conv import test_causal_conv1d as conv
from tests.pallas_kernels.gdn import test_gdn_chunk as gdnc
from tests.pallas_kernels.gdn import test_gdn_state_update as gdnu
from tests.pallas_kernels.ssd import test_ssd_chunk_scan as scan
from tests.pallas_kernels.ssd import test_ssd_state_update as ssu

IMPLEMENTATIONS = ["interpret", "reference"]


def _bad_ids(num_slots: int) -> list[int]:
    return [num_slots, num_slots + 5, -1, -num_slots + 1]


def _same_as_null(run, fields: dict[str, np.ndarray], edits: list[tuple[str, tuple]], size: int):
    """run(fields) with out-of-range ids at `edits` equals run(fields) with NULL there, bitwise."""
    bad = {k: v.copy() for k, v in fields.items()}
    null = {k: v.copy() for k, v in fields.items()}
    for (name, index), value in zip(edits, _bad_ids(size) * 2, strict=False):
        bad[name][index] = value
        null[name][index] = 0
    for got, want in zip(run(bad), run(null), strict=True):
        got, want = np.asarray(got), np.asarray(want)
        assert got.tobytes() == want.tobytes(), "an out-of-range id read or wrote a live entry"


@pytest.mark.parametrize("implementation", IMPLEMENTATIONS)
def test_conv_prefill(implementation):
    d = conv.prefill_inputs(3, (5, 1, 4), 6, 4)
    d["has_initial_state"][:3] = True

    def run(f):
        return ops.causal_conv1d_prefill(
            *conv.prefill_args({**d, **f}), implementation=implementation
        )

    edits = [
        ("read_slots", (0,)),
        ("read_slots", (1,)),
        ("write_slots", (2,)),
        ("write_slots", (0,)),
    ]
    fields = {k: d[k] for k in ("read_slots", "write_slots")}
    _same_as_null(run, fields, edits, d["conv_state"].shape[0])


@pytest.mark.parametrize("implementation", IMPLEMENTATIONS)
def test_conv_update(implementation):
    d = conv.update_inputs(4, 3, 2, 6, 4)

    def run(f):
        return ops.causal_conv1d_update(
            *conv._args({**d, **f}, conv.UPDATE), implementation=implementation
        )

    edits = [("read_slots", (0,)), ("write_slots", (1, 0)), ("write_slots", (2, 1))]
    fields = {k: d[k] for k in ("read_slots", "write_slots")}
    _same_as_null(run, fields, edits, d["conv_state"].shape[0])


@pytest.mark.parametrize("algorithm", ["sequential", "parallel"])
@pytest.mark.parametrize("implementation", IMPLEMENTATIONS)
def test_ssd_chunk_scan(implementation, algorithm):
    d = scan.make_inputs(5, (6, 1, 39), slots=14, num_computed=[13, 0, 10, 0])
    d["has_initial_state"][:3] = True
    free = sorted(set(range(1, 14)) - set(d["read_slots"]) - set(d["write_slots"]))
    d["boundary_slots"] = np.array([[free[0], 0], [0, 0], [free[1], free[2]], [0, 0]], np.int32)

    def run(f):
        return scan.run(
            {**d, **f},
            implementation,
            chunk_size=16,
            block_size=16,
            boundary_slots=f["boundary_slots"],
            algorithm=algorithm,
        )

    edits = [
        ("read_slots", (0,)),
        ("read_slots", (2,)),
        ("write_slots", (1,)),
        ("boundary_slots", (0, 0)),
        ("boundary_slots", (2, 1)),
    ]
    fields = {k: d[k] for k in ("read_slots", "write_slots", "boundary_slots")}
    _same_as_null(run, fields, edits, 14)


@pytest.mark.parametrize("implementation", IMPLEMENTATIONS)
def test_ssd_state_update(implementation):
    d = ssu.make_inputs(6, 3, 2)

    def run(f):
        return ssu.run({**d, **f}, implementation)

    edits = [("read_slots", (0,)), ("write_slots", (1, 1)), ("write_slots", (0, 0))]
    fields = {k: d[k] for k in ("read_slots", "write_slots")}
    _same_as_null(run, fields, edits, d["ssm_state"].shape[0])


@pytest.mark.parametrize("implementation", IMPLEMENTATIONS)
def test_gdn_chunk(implementation):
    args, kw = gdnc.make_case([5, 1, 20], [0, 3, 9], [True, True, True], T=30, nb=1, bs=16)
    names = {"read_slots": 9, "write_slots": 10}

    def run(f):
        a = list(args)
        for name, i in names.items():
            a[i] = f[name]
        rows = gdnc.as_rows(a, block_size=16, boundary_slots=f["boundary_slots"])
        return ops.gdn_chunk(*rows, chunk_size=16, implementation=implementation)

    fields = {n: args[i] for n, i in names.items()} | {"boundary_slots": kw["boundary_slots"]}
    edits = [("read_slots", (0,)), ("write_slots", (1,)), ("boundary_slots", (2, 0))]
    _same_as_null(run, fields, edits, args[5].shape[0])


@pytest.mark.parametrize("implementation", IMPLEMENTATIONS)
def test_gdn_state_update(implementation):
    args = gdnu.make_case(3, 2)

    def run(f):
        return ops.gdn_state_update(
            *args[:8], f["read_slots"], f["write_slots"], implementation=implementation
        )

    edits = [("read_slots", (0,)), ("write_slots", (1, 0)), ("write_slots", (2, 1))]
    _same_as_null(run, {"read_slots": args[8], "write_slots": args[9]}, edits, args[7].shape[0])


def _kv_pool(num_blocks=5, block_size=4, kv_heads=1, head_dim=8):
    rng = np.random.default_rng(0)
    k, v = (
        rng.standard_normal((num_blocks, block_size, kv_heads, head_dim)).astype(np.float32)
        for _ in range(2)
    )
    k[0] = v[0] = np.nan  # the NULL block
    return k, v


def test_paged_attention_block_table():
    k_cache, v_cache = _kv_pool()
    q = np.random.default_rng(1).standard_normal((3, 2, 8)).astype(np.float32)
    table = np.array([[1, 2, 0], [3, 4, 0]], np.int32)
    rows, positions = np.array([0, 0, 1], np.int32), np.array([9, 10, 5], np.int32)

    def run(f):
        out = ops.paged_attention(
            q, k_cache, v_cache, f["table"], f["rows"], positions, np.ones(3, bool), scale=0.3
        )
        return (out,)

    edits = [("table", (0, 2)), ("table", (1, 2))]
    _same_as_null(run, {"table": table, "rows": rows}, edits, 5)
    out = np.asarray(run({"table": table, "rows": np.array([0, 0, 7], np.int32)})[0])
    assert np.isfinite(out).all()  # a row index past the table reads an all-NULL row: no keys


@pytest.mark.parametrize("dtype", [np.float32, ml_dtypes.float8_e4m3fn], ids=["fp32", "fp8"])
def test_write_kv_drops_out_of_range_slots(dtype):
    """Also for an FP8 pool (`kv_cache_dtype="fp8"`): its NaN NULL block stays bit-identical."""
    k_cache, v_cache = (pool.astype(dtype) for pool in _kv_pool())
    k, v = np.ones((4, 1, 8), np.float32), 2 * np.ones((4, 1, 8), np.float32)
    slots, valid = np.array([5, 13, 9, 0], np.int32), np.array([True, True, True, False])

    def run(f):
        return ops.write_kv(k_cache, v_cache, k, v, f["slots"], f["valid"])

    bad, null = slots.copy(), slots.copy()
    bad[[0, 2]] = [-1, 20 * 4]  # 20 = num_blocks * block_size
    null_valid = valid.copy()
    null_valid[[0, 2]] = False
    for got, want in zip(
        run({"slots": bad, "valid": valid}), run({"slots": null, "valid": null_valid}), strict=True
    ):
        assert np.asarray(got).tobytes() == np.asarray(want).tobytes()
    new_k = np.asarray(run({"slots": slots, "valid": valid})[0]).reshape(20, 1, 8)
    assert np.all(new_k[[5, 13, 9]] == 1) and np.isnan(new_k[0]).all()


def test_embedding_and_logits_gathers_read_zeros():
    table = np.arange(12, dtype=np.float32).reshape(4, 3) + 1
    got = np.asarray(rows_or_zeros(jnp.asarray(table), jnp.asarray([2, 4, -1, 9, 0])))
    np.testing.assert_array_equal(got, [table[2], [0, 0, 0], [0, 0, 0], [0, 0, 0], table[0]])
