"""Grouped matmul: the kernel (interpret mode) against a float64 numpy loop over the groups and
against XLA's ragged_dot (the reference).

Odd M / K / N / G, empty groups, every row in one group, rows past sum(group_sizes) (they must be
0), bf16 and fp32 operands, several tile sizes, NaN weights of empty groups and NaN in rows in no
group (never read), and a row's bitwise independence from the other rows and their number.
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest

from pallas_kernels import ops
from pallas_kernels.moe.grouped_matmul import GroupedMatmulTuning, grouped_matmul
from pallas_kernels.moe.reference import grouped_matmul_reference

SMALL_TILES = GroupedMatmulTuning(block_m=16, block_n=16, block_k=16)  # several tiles everywhere
TOLERANCE = {np.float32: 1e-5, jnp.bfloat16: 1e-5}  # fp32 accumulation of exact bf16 products


def oracle(lhs: np.ndarray, rhs: np.ndarray, group_sizes: list[int]) -> np.ndarray:
    """float64 loop over the groups: out[rows of g] = lhs[rows of g] @ rhs[g]; 0 elsewhere."""
    lhs, rhs = np.asarray(lhs, np.float64), np.asarray(rhs, np.float64)
    out = np.zeros((lhs.shape[0], rhs.shape[2]))
    start = 0
    for g, size in enumerate(group_sizes):
        rows = slice(start, min(start + size, lhs.shape[0]))
        out[rows] = lhs[rows] @ rhs[g]
        start += size
    return out


def make_case(rng, num_rows: int, k: int, n: int, group_sizes: list[int], dtype):
    lhs = rng.standard_normal((num_rows, k)).astype(np.float32)
    rhs = (rng.standard_normal((len(group_sizes), k, n)) / k**0.5).astype(np.float32)
    return (
        np.array(jnp.asarray(lhs, dtype)),
        np.array(jnp.asarray(rhs, dtype)),
        np.asarray(group_sizes, np.int32),
    )


def rel_err(got, want) -> float:
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    return float(np.linalg.norm(got - want) / max(np.linalg.norm(want), 1e-30))


@pytest.mark.parametrize(
    "num_rows, k, n, group_sizes",
    [
        (23, 24, 12, [23]),  # G = 1: every row in one group
        (37, 80, 96, [5, 0, 17, 1, 14]),  # an empty group; a group spanning row tiles
        (30, 24, 96, [0, 3, 0, 0, 9, 2, 0]),  # G = 7, sum 14 < 30: 16 rows in no group
        (9, 80, 12, [0, 0, 0, 0, 9]),  # leading empty groups, every row in the last
        (4, 24, 12, [0, 0, 0]),  # no rows in any group: all zeros
    ],
)
@pytest.mark.parametrize("dtype", [np.float32, jnp.bfloat16])
@pytest.mark.parametrize("tuning", [GroupedMatmulTuning(), SMALL_TILES], ids=["default", "small"])
def test_matches_oracle_and_reference(num_rows, k, n, group_sizes, dtype, tuning):
    rng = np.random.default_rng(num_rows * 1000 + k + n)
    lhs, rhs, sizes = make_case(rng, num_rows, k, n, group_sizes, dtype)
    out = np.asarray(grouped_matmul(lhs, rhs, sizes, tuning=tuning, interpret=True))
    ref = np.asarray(grouped_matmul_reference(lhs, rhs, sizes))
    want = oracle(lhs, rhs, group_sizes)
    assert out.dtype == np.float32 and out.shape == (num_rows, n)
    assert rel_err(out, want) <= TOLERANCE[dtype]
    assert rel_err(ref, want) <= TOLERANCE[dtype]
    assert not np.any(out[sum(group_sizes) :]), "rows in no group must be 0"


def test_output_in_the_input_dtype():
    lhs, rhs, sizes = make_case(np.random.default_rng(1), 21, 80, 96, [4, 0, 11, 6], jnp.bfloat16)
    out = grouped_matmul(lhs, rhs, sizes, out_dtype=jnp.bfloat16, interpret=True)
    assert out.dtype == jnp.bfloat16
    want = oracle(lhs, rhs, [4, 0, 11, 6])
    assert rel_err(out, want) <= 1e-2
    # Rounded once from the fp32 result: the same bits as the reference's rounding.
    ref = grouped_matmul_reference(lhs, rhs, sizes, out_dtype=jnp.bfloat16)
    assert rel_err(out, ref) <= 1e-2


def test_group_sizes_past_the_rows_are_clipped():
    """sum(group_sizes) > M (as ragged_dot allows): groups are cut at row M."""
    lhs, rhs, sizes = make_case(np.random.default_rng(2), 10, 24, 12, [4, 8, 3], np.float32)
    out = grouped_matmul(lhs, rhs, sizes, tuning=SMALL_TILES, interpret=True)
    assert rel_err(out, oracle(lhs, rhs, [4, 8, 3])) <= 1e-5


def test_unused_weights_and_rows_are_never_read():
    """NaN in the weights of empty groups and in rows past sum(group_sizes) reach no output."""
    group_sizes = [3, 0, 6, 0]
    lhs, rhs, sizes = make_case(np.random.default_rng(3), 13, 80, 12, group_sizes, np.float32)
    clean = oracle(lhs, rhs, group_sizes)
    rhs[[1, 3]] = np.nan
    lhs[9:] = np.nan
    out = np.asarray(grouped_matmul(lhs, rhs, sizes, tuning=SMALL_TILES, interpret=True))
    assert np.all(np.isfinite(out))
    assert rel_err(out, clean) <= 1e-5
    assert not np.any(out[9:])


@pytest.mark.parametrize("dtype", [np.float32, jnp.bfloat16])
def test_a_row_does_not_depend_on_other_rows(dtype):
    """Batch invariance: a row's output bits stay the same when the other rows change values,
    when its group gains rows before it (it moves inside its row tile), and when padding rows
    are added (M changes)."""
    rng = np.random.default_rng(4)
    lhs, rhs, sizes = make_case(rng, 20, 80, 96, [2, 7, 0, 11], dtype)
    probe = 5  # row 3 of group 1
    base = np.asarray(grouped_matmul(lhs, rhs, sizes, interpret=True))[probe]

    others = make_case(rng, 20, 80, 96, [2, 7, 0, 11], dtype)[0]
    others[probe] = lhs[probe]
    changed = np.asarray(grouped_matmul(others, rhs, sizes, interpret=True))[probe]
    assert changed.tobytes() == base.tobytes()

    # 9 more rows in group 1 ahead of the probe, and 12 padding rows at the end.
    extra = make_case(rng, 9, 80, 96, [9], dtype)[0]
    grown = np.concatenate([lhs[:2], extra, lhs[2:], np.zeros((12, 80), lhs.dtype)])
    grown_sizes = np.asarray([2, 16, 0, 11], np.int32)
    moved = np.asarray(grouped_matmul(grown, rhs, grown_sizes, interpret=True))[probe + 9]
    assert moved.tobytes() == base.tobytes()


def test_dispatched_op_runs_the_kernel_and_the_reference():
    lhs, rhs, sizes = make_case(np.random.default_rng(5), 15, 24, 12, [6, 0, 9], np.float32)
    want = oracle(lhs, rhs, [6, 0, 9])
    for implementation in ("interpret", "reference"):
        out = ops.grouped_matmul(lhs, rhs, sizes, implementation=implementation)
        assert rel_err(out, want) <= 1e-5


@pytest.mark.parametrize(
    "lhs_shape, rhs_shape, sizes_shape, match",
    [
        ((4, 8), (2, 9, 5), (2,), "rhs has shape"),
        ((4, 8, 1), (2, 8, 5), (2,), "lhs has shape"),
        ((4, 8), (2, 8, 5), (3,), "group_sizes has shape"),
        ((4, 8), (0, 8, 5), (0,), "rhs has shape"),
    ],
)
def test_bad_shapes_raise(lhs_shape, rhs_shape, sizes_shape, match):
    args = (np.zeros(lhs_shape, np.float32), np.zeros(rhs_shape, np.float32))
    for fn in (grouped_matmul, grouped_matmul_reference):
        with pytest.raises(ValueError, match=match):
            fn(*args, np.zeros(sizes_shape, np.int32))


def test_bad_dtypes_and_tuning_raise():
    lhs, rhs = np.zeros((4, 8), np.float32), np.zeros((2, 8, 5), np.float32)
    with pytest.raises(ValueError, match="group_sizes has dtype"):
        grouped_matmul(lhs, rhs, np.zeros(2, np.float32), interpret=True)
    with pytest.raises(ValueError, match="out_dtype=int32"):
        grouped_matmul(lhs, rhs, np.zeros(2, np.int32), out_dtype=jnp.int32, interpret=True)
    with pytest.raises(ValueError, match="block_m=8"):
        GroupedMatmulTuning(block_m=8)
    with pytest.raises(ValueError, match="block_k=48"):
        GroupedMatmulTuning(block_k=48)
    with pytest.raises(ValueError, match="num_warps=3"):
        GroupedMatmulTuning(num_warps=3)
