"""Fixed-tile matmul: the kernel (interpret mode) against a float64 numpy product and against
XLA's dot (the reference); its static plan (the split of K comes from the weight's shape); and
a row's bitwise independence from the other rows, their number and its place among them.

Odd M / K / N (one partial tile of each), K split in parts with a short last part, bf16 and fp32
operands, outputs in bf16 and fp32, the `Linear` layer under `batch_invariant()`.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from jmamba.layers.invariance import batch_invariant
from jmamba.layers.linear import Linear
from pallas_kernels import ops
from pallas_kernels.matmul.fixed_tiles import MatmulTuning, matmul, plan
from pallas_kernels.matmul.reference import matmul_reference

SMALL_TILES = MatmulTuning(block_m=16, block_n=16, block_k=16, min_programs=8, min_split=32)
TOLERANCE = {np.float32: 1e-5, jnp.bfloat16: 1e-5}  # fp32 accumulation of exact bf16 products


def make_case(rng, m: int, k: int, n: int, dtype) -> tuple[np.ndarray, np.ndarray]:
    x = rng.standard_normal((m, k)).astype(np.float32)
    w = (rng.standard_normal((k, n)) / k**0.5).astype(np.float32)
    return np.array(jnp.asarray(x, dtype)), np.array(jnp.asarray(w, dtype))


def rel_err(got, want) -> float:
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    return float(np.linalg.norm(got - want) / max(np.linalg.norm(want), 1e-30))


def oracle(x: np.ndarray, w: np.ndarray) -> np.ndarray:
    return np.asarray(x, np.float64) @ np.asarray(w, np.float64)


@pytest.mark.parametrize(
    "m, k, n, tuning, splits",
    [
        (1, 80, 96, MatmulTuning(), 1),  # one row, one partial tile of K and of N
        (37, 200, 45, SMALL_TILES, 4),  # K 200 in 4 parts of 64: the last holds 8
        (19, 96, 33, SMALL_TILES, 2),
        (40, 24, 200, SMALL_TILES, 1),  # 13 column tiles: enough programs, no split
    ],
)
@pytest.mark.parametrize("dtype", [np.float32, jnp.bfloat16])
def test_matches_oracle_and_reference(m, k, n, tuning, splits, dtype):
    assert plan(k, n, tuning).num_splits == splits
    x, w = make_case(np.random.default_rng(m * 1000 + k + n), m, k, n, dtype)
    out = np.asarray(matmul(x, w, tuning=tuning, interpret=True))
    ref = np.asarray(matmul_reference(x, w))
    want = oracle(x, w)
    assert out.dtype == np.float32 and out.shape == (m, n)
    assert rel_err(out, want) <= TOLERANCE[dtype]
    assert rel_err(ref, want) <= TOLERANCE[dtype]


@pytest.mark.parametrize("tuning", [MatmulTuning(), SMALL_TILES], ids=["default", "split"])
def test_output_in_bf16_is_rounded_once(tuning):
    x, w = make_case(np.random.default_rng(1), 21, 200, 45, jnp.bfloat16)
    out = np.asarray(matmul(x, w, out_dtype=jnp.bfloat16, tuning=tuning, interpret=True))
    exact = np.asarray(matmul(x, w, tuning=tuning, interpret=True))
    assert out.dtype == jnp.bfloat16
    assert out.tobytes() == np.asarray(jnp.asarray(exact, jnp.bfloat16)).tobytes()


def test_plan_comes_from_the_weight_shape():
    """K splits while one row tile has fewer than min_programs programs and each part keeps
    min_split of K; parts are whole block_k slices; small weights shrink the tiles."""
    tuning = MatmulTuning(block_n=64, block_k=64, min_programs=128, min_split=512)
    assert plan(8192, 2048, tuning).num_splits == 4  # 32 column tiles
    assert plan(2048, 8192, tuning).num_splits == 1  # 128 column tiles
    assert plan(1000, 64, tuning).num_splits == 1  # 2 * 512 > 1000: no room to split
    assert plan(4096, 64, tuning).num_splits == 8  # parts of 512, no fewer
    small = plan(24, 12, tuning)
    assert (small.block_n, small.block_k, small.num_splits) == (16, 32, 1)
    odd = plan(1100, 64, MatmulTuning(min_split=500))
    assert (odd.num_splits, odd.split_len) == (2, 576)  # 1100 / 2 rounded up to slices of 64


@pytest.mark.parametrize("dtype", [np.float32, jnp.bfloat16])
@pytest.mark.parametrize("tuning", [MatmulTuning(), SMALL_TILES], ids=["default", "split"])
def test_a_row_does_not_depend_on_other_rows(dtype, tuning):
    """Batch invariance: a row's output bits are the same alone (M = 1), beside other rows of
    other values, at another place in its row tile, and among enough rows for several tiles."""
    rng = np.random.default_rng(4)
    x, w = make_case(rng, 40, 200, 45, dtype)
    probe = x[7:8]
    alone = np.asarray(matmul(probe, w, tuning=tuning, interpret=True))[0]
    for m, place in ((2, 1), (16, 9), (40, 7), (53, 50)):
        rows = make_case(rng, m, 200, 45, dtype)[0]
        rows[place] = probe[0]
        out = np.asarray(matmul(rows, w, tuning=tuning, interpret=True))[place]
        assert out.tobytes() == alone.tobytes(), (m, place)


def test_dispatched_op_runs_the_kernel_and_the_reference():
    x, w = make_case(np.random.default_rng(5), 15, 80, 24, np.float32)
    for implementation in ("interpret", "reference"):
        out = ops.matmul(x, w, implementation=implementation)
        assert rel_err(out, oracle(x, w)) <= 1e-5


def test_linear_runs_the_kernel_under_the_switch(monkeypatch):
    """Inside `batch_invariant()` a Linear layer (leading axes kept) runs ops.matmul;
    outside it XLA's dot. Same values either way."""
    monkeypatch.setenv("JMAMBA_KERNELS", "interpret")
    layer = Linear(80, 24, rngs=nnx.Rngs(0))
    x = jax.random.normal(jax.random.key(1), (3, 5, 80))
    calls = []
    original = ops.matmul
    monkeypatch.setattr(ops, "matmul", lambda *a, **kw: calls.append(1) or original(*a, **kw))
    plain = layer(x)
    assert not calls
    with batch_invariant():
        fixed = layer(x)
    assert calls and fixed.shape == (3, 5, 24)
    assert rel_err(fixed, plain) <= 1e-5


@pytest.mark.parametrize(
    "x_shape, w_shape, match",
    [((4, 8), (9, 5), "w has shape"), ((4, 8, 1), (8, 5), "x has shape"), ((4, 8), (8,), "w has")],
)
def test_bad_shapes_raise(x_shape, w_shape, match):
    for fn in (matmul, matmul_reference):
        with pytest.raises(ValueError, match=match):
            fn(np.zeros(x_shape, np.float32), np.zeros(w_shape, np.float32))


def test_bad_dtypes_and_tuning_raise():
    x, w = np.zeros((4, 8), np.float32), np.zeros((8, 5), np.float32)
    with pytest.raises(ValueError, match="one dtype"):
        matmul(x, np.zeros((8, 5), jnp.bfloat16), interpret=True)
    with pytest.raises(ValueError, match="out_dtype=int32"):
        matmul(x, w, out_dtype=jnp.int32, interpret=True)
    with pytest.raises(ValueError, match="block_n=48"):
        MatmulTuning(block_n=48)
    with pytest.raises(ValueError, match="min_split=0"):
        MatmulTuning(min_split=0)
