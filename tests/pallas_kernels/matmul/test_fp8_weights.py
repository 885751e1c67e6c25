"""Weight-only FP8 matmul: the kernel (interpret mode) against its reference and a float64 numpy
product of the dequantized weight, per tensor, per channel, 128 x 128 and 16 x 24 blocks, on
shapes no tile or block divides, M = 1, 3, 17, 64, bf16 and fp32 rows, outputs rounded once; its
plan (K slices inside one scale block); a row's bitwise independence from the other rows; the
dispatched op; the input checks; and the Triton lowering for CUDA (no GPU needed).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest

from pallas_kernels import ops
from pallas_kernels._common import lower_for_cuda
from pallas_kernels.matmul.fixed_tiles import MatmulTuning
from pallas_kernels.matmul.fp8_reference import fp8_weight_matmul_reference, scale_shape
from pallas_kernels.matmul.fp8_weights import (
    FP8_TUNING,
    fp8_plan,
    fp8_weight_matmul,
    supports_block,
)

E4M3 = ml_dtypes.float8_e4m3fn
# Several row tiles, column tiles and K parts at test sizes: K 200 in 4 parts of 64.
SMALL_TILES = MatmulTuning(block_m=16, block_n=16, block_k=32, min_programs=64, min_split=32)


def make_case(rng, m: int, k: int, n: int, block, dtype=jnp.bfloat16):
    x = np.array(jnp.asarray(rng.standard_normal((m, k)).astype(np.float32), dtype))
    w = (rng.standard_normal((k, n)) * 100).clip(-448, 448).astype(E4M3)
    scale = rng.uniform(1e-3, 1e-2, scale_shape(k, n, block)).astype(np.float32)
    return x, w, scale


def oracle(x, w, scale, block) -> np.ndarray:
    """x @ (entry * block scale), in float64."""
    k, n = w.shape
    grid = np.repeat(np.repeat(scale.astype(np.float64), block[0] or k, 0), block[1] or n, 1)
    return np.asarray(x, np.float64) @ (w.astype(np.float64) * grid[:k, :n])


def rel_err(got, want) -> float:
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    return float(np.abs(got - want).max() / max(np.abs(want).max(), 1e-30))


@pytest.mark.parametrize(
    "m, k, n, block, tuning, splits",
    [
        (1, 200, 300, (0, 0), FP8_TUNING, 1),  # per tensor
        (3, 200, 300, (0, 1), FP8_TUNING, 1),  # per channel
        (17, 200, 300, (128, 128), FP8_TUNING, 1),  # two K groups, the last of 72 rows
        (64, 130, 260, (128, 128), FP8_TUNING, 1),
        (17, 130, 260, (0, 1), SMALL_TILES, 3),  # K in parts of 64, the last of 2
        (3, 200, 300, (128, 128), SMALL_TILES, 4),  # 2 parts of 2 slices a K group
        (17, 200, 72, (16, 24), SMALL_TILES, 4),  # column blocks across column tiles
    ],
)
def test_matches_reference_and_oracle(m, k, n, block, tuning, splits):
    assert fp8_plan(k, n, block, tuning).num_splits == splits
    x, w, scale = make_case(np.random.default_rng(m + k + n), m, k, n, block)
    kw = dict(block=block, out_dtype=jnp.float32)
    out = np.asarray(fp8_weight_matmul(x, w, scale, tuning=tuning, interpret=True, **kw))
    ref = np.asarray(fp8_weight_matmul_reference(x, w, scale, **kw))
    want = oracle(x, w, scale, block)
    assert out.shape == (m, n) and out.dtype == np.float32
    assert rel_err(out, want) <= 1e-6  # exact products, fp32 sums
    assert rel_err(ref, want) <= 1e-6


def test_fp32_rows_and_bf16_output_rounded_once():
    """fp32 rows run full-precision dots; a bf16 output is the fp32 result rounded once."""
    block = (128, 128)
    x, w, scale = make_case(np.random.default_rng(1), 5, 200, 72, block, np.float32)
    fp32 = np.asarray(
        fp8_weight_matmul(x, w, scale, block=block, out_dtype=jnp.float32, interpret=True)
    )
    assert rel_err(fp32, oracle(x, w, scale, block)) <= 1e-6
    for tuning in (FP8_TUNING, SMALL_TILES):
        kw = dict(block=block, tuning=tuning, interpret=True)
        bf16 = np.asarray(fp8_weight_matmul(x, w, scale, out_dtype=jnp.bfloat16, **kw))
        exact = np.asarray(fp8_weight_matmul(x, w, scale, out_dtype=jnp.float32, **kw))
        assert bf16.tobytes() == np.asarray(jnp.asarray(exact, jnp.bfloat16)).tobytes()


@pytest.mark.parametrize("block", [(0, 1), (128, 128)])
@pytest.mark.parametrize("tuning", [FP8_TUNING, SMALL_TILES], ids=["default", "split"])
def test_a_row_does_not_depend_on_other_rows(block, tuning):
    """Batch invariance: a row's output bits are the same alone (M = 1) and among 37 rows of
    other values, at several places (other row tiles among them)."""
    rng = np.random.default_rng(4)
    x, w, scale = make_case(rng, 37, 200, 72, block)
    run = functools.partial(
        fp8_weight_matmul, w=w, scale=scale, block=block, tuning=tuning, interpret=True
    )
    together = np.asarray(run(x))
    for place in (0, 16, 36):
        alone = np.asarray(run(x[place : place + 1]))[0]
        assert alone.tobytes() == together[place].tobytes(), place


def test_plan_slices_lie_in_one_scale_block():
    """block_k divides the block's rows where the scale varies along K; otherwise the matmul
    plan stands. Blocks of rows not a multiple of 16 are refused only when they split K."""
    tuning = MatmulTuning(block_k=128)
    assert fp8_plan(2048, 8192, (128, 128), tuning).block_k == 128
    assert fp8_plan(2048, 8192, (48, 128), tuning).block_k == 16
    assert fp8_plan(2048, 8192, (0, 1), tuning).block_k == 128
    assert fp8_plan(200, 300, (256, 1), tuning).block_k == 128  # one K group
    assert fp8_plan(8192, 2048, (0, 1), FP8_TUNING).num_splits == 4  # 32 column tiles
    assert fp8_plan(2048, 8192, (0, 1), FP8_TUNING).num_splits == 1  # 128 column tiles
    assert supports_block(200, (16, 24)) and supports_block(20, (24, 24))
    assert not supports_block(200, (24, 24))


def test_dispatched_op_runs_the_kernel_and_the_reference():
    block = (128, 128)
    x, w, scale = make_case(np.random.default_rng(5), 3, 130, 40, block)
    want = oracle(x, w, scale, block)
    for implementation in ("interpret", "reference"):
        out = ops.fp8_weight_matmul(
            x, w, scale, block=block, out_dtype=jnp.float32, implementation=implementation
        )
        assert rel_err(out, want) <= 1e-6, implementation


@pytest.mark.parametrize(
    "changes, match",
    [
        (dict(x=np.zeros((4, 32, 1), jnp.bfloat16)), r"x has shape \(4, 32, 1\)"),
        (dict(w=np.zeros((31, 8), E4M3)), r"w has shape \(31, 8\); expected \(32, None\)"),
        (dict(w=np.zeros((32, 8), jnp.bfloat16)), "w has dtype bfloat16"),
        (dict(x=np.zeros((4, 32), np.int32)), "x has dtype int32"),
        (dict(scale=np.ones((1, 1), np.float32)), r"scale has shape \(1, 1\); expected \(1, 8\)"),
        (dict(scale=np.ones((1, 8), jnp.bfloat16)), "scale has dtype bfloat16"),
        (dict(block=(-1, 1)), "block=\\(-1, 1\\) must be two sizes >= 0"),
        (dict(out_dtype=jnp.int32), "out_dtype=int32"),
    ],
)
def test_bad_arguments_raise(changes, match):
    args = dict(
        x=np.zeros((4, 32), jnp.bfloat16),
        w=np.zeros((32, 8), E4M3),
        scale=np.ones((1, 8), np.float32),
        block=(0, 1),
        out_dtype=jnp.bfloat16,
    )
    args |= changes
    for fn in (functools.partial(fp8_weight_matmul, interpret=True), fp8_weight_matmul_reference):
        with pytest.raises(ValueError, match=match):
            fn(**args)


def test_kernel_refuses_blocks_it_cannot_slice():
    x, w, scale = make_case(np.random.default_rng(6), 2, 200, 48, (24, 24))
    with pytest.raises(ValueError, match=r"block=\(24, 24\) with w of shape \(200, 48\)"):
        fp8_weight_matmul(x, w, scale, block=(24, 24), interpret=True)
    out = fp8_weight_matmul_reference(x, w, scale, block=(24, 24), out_dtype=jnp.float32)
    assert rel_err(out, oracle(x, w, scale, (24, 24))) <= 1e-6  # the reference takes any block


@pytest.mark.parametrize("block, dtype", [((128, 128), jnp.bfloat16), ((0, 1), jnp.float32)])
def test_lowers_to_triton_for_cuda(block, dtype):
    """The Triton lowering (no PTX) of an odd shape with e4m3 loads converted in registers."""
    k, n = 200, 300
    args = (
        jax.ShapeDtypeStruct((17, k), dtype),
        jax.ShapeDtypeStruct((k, n), jnp.float8_e4m3fn),
        jax.ShapeDtypeStruct(scale_shape(k, n, block), jnp.float32),
    )
    text = lower_for_cuda(functools.partial(fp8_weight_matmul, block=block), *args)
    assert "triton" in text
