"""Weight-only FP8 grouped matmul: the kernel (interpret mode) against its dequantizing reference
and a float64 loop over the groups of the dequantized weights, per tensor, per channel and in
blocks (one that varies along K, cut short at the edges), odd expert counts (5, 7) with empty
groups and rows in no group (0), non-power-of-two K and N, bf16 and fp32 rows; the dispatched
op; the refusals; the Triton lowering for CUDA (no GPU needed).
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
from pallas_kernels.matmul.fp8_reference import scale_shape
from pallas_kernels.moe.fp8_grouped_matmul import fp8_grouped_matmul, supports_block
from pallas_kernels.moe.fp8_reference import fp8_grouped_matmul_reference
from pallas_kernels.moe.grouped_matmul import GroupedMatmulTuning
from tests.pallas_kernels.moe.test_grouped_matmul import oracle, rel_err

E4M3 = ml_dtypes.float8_e4m3fn
SMALL_TILES = GroupedMatmulTuning(block_m=16, block_n=16, block_k=16)  # several tiles everywhere


def make_case(rng, num_rows: int, k: int, n: int, group_sizes: list[int], block, dtype):
    lhs = np.array(jnp.asarray(rng.standard_normal((num_rows, k)).astype(np.float32), dtype))
    shape = (len(group_sizes), k, n)
    rhs = (rng.standard_normal(shape) * 100).clip(-448, 448).astype(E4M3)
    scale = rng.uniform(1e-3, 1e-2, (len(group_sizes), *scale_shape(k, n, block)))
    return lhs, rhs, scale.astype(np.float32), np.asarray(group_sizes, np.int32)


def dequantized(rhs: np.ndarray, scale: np.ndarray, block) -> np.ndarray:
    """rhs's values in float64: each entry times its group's block scale."""
    _, k, n = rhs.shape
    grid = np.repeat(scale.astype(np.float64), block[0] or k, 1)
    grid = np.repeat(grid, block[1] or n, 2)[:, :k, :n]
    return rhs.astype(np.float64) * grid


@pytest.mark.parametrize(
    "num_rows, k, n, group_sizes, block, dtype",
    [
        # K blocks cut short, column blocks across column tiles
        (37, 200, 72, [5, 0, 17, 1, 14], (32, 24), jnp.bfloat16),
        (30, 130, 96, [0, 3, 0, 0, 9, 2, 0], (0, 1), jnp.bfloat16),  # G = 7, 16 rows in no group
        (9, 80, 40, [0, 4, 5], (0, 0), np.float32),  # one scale per expert
        (21, 72, 130, [4, 0, 11, 6, 0], (16, 1), np.float32),  # K groups of 16 rows, per column
    ],
)
def test_matches_reference_and_oracle(num_rows, k, n, group_sizes, block, dtype):
    rng = np.random.default_rng(num_rows + k + n)
    lhs, rhs, scale, sizes = make_case(rng, num_rows, k, n, group_sizes, block, dtype)
    kw = dict(block=block)
    out = np.asarray(
        fp8_grouped_matmul(lhs, rhs, scale, sizes, tuning=SMALL_TILES, interpret=True, **kw)
    )
    ref = np.asarray(fp8_grouped_matmul_reference(lhs, rhs, scale, sizes, **kw))
    want = oracle(lhs, dequantized(rhs, scale, block), group_sizes)
    assert out.shape == (num_rows, n) and out.dtype == np.float32
    assert rel_err(out, want) <= 1e-6 and rel_err(ref, want) <= 1e-6  # exact products
    assert not np.any(out[sum(group_sizes) :]), "rows in no group must be 0"


def test_dispatched_op_runs_the_kernel_and_the_reference():
    block = (0, 1)
    lhs, rhs, scale, sizes = make_case(
        np.random.default_rng(3), 11, 40, 24, [3, 8, 0], block, jnp.bfloat16
    )
    want = oracle(lhs, dequantized(rhs, scale, block), [3, 8, 0])
    for implementation in ("interpret", "reference"):
        out = ops.fp8_grouped_matmul(
            lhs, rhs, scale, sizes, block=block, implementation=implementation
        )
        assert rel_err(out, want) <= 1e-6, implementation


@pytest.mark.parametrize(
    "changes, match",
    [
        (dict(rhs=np.zeros((3, 32, 8), jnp.bfloat16)), "rhs has dtype bfloat16"),
        (dict(lhs=np.zeros((4, 32), np.int32)), "lhs has dtype int32"),
        (dict(scale=np.ones((3, 1, 1), np.float32)), r"scale has shape \(3, 1, 1\)"),
        (dict(scale=np.ones((3, 1, 8), jnp.bfloat16)), "scale has dtype bfloat16"),
        (dict(block=(-1, 1)), r"block=\(-1, 1\) must be two sizes >= 0"),
    ],
)
def test_bad_arguments_raise(changes, match):
    args = dict(
        lhs=np.zeros((4, 32), jnp.bfloat16),
        rhs=np.zeros((3, 32, 8), E4M3),
        scale=np.ones((3, 1, 8), np.float32),
        group_sizes=np.asarray([1, 2, 1], np.int32),
        block=(0, 1),
    )
    args |= changes
    kernel = functools.partial(fp8_grouped_matmul, interpret=True)
    for fn in (kernel, fp8_grouped_matmul_reference):
        with pytest.raises(ValueError, match=match):
            fn(**args)


def test_kernel_refuses_blocks_it_cannot_slice():
    block = (24, 24)
    assert supports_block(20, block) and not supports_block(200, block)
    args = make_case(np.random.default_rng(6), 5, 200, 48, [2, 3], block, jnp.bfloat16)
    with pytest.raises(ValueError, match=r"block=\(24, 24\) with rhs of shape \(2, 200, 48\)"):
        fp8_grouped_matmul(*args, block=block, interpret=True)
    out = fp8_grouped_matmul_reference(*args, block=block)  # the reference takes any block
    assert rel_err(out, oracle(args[0], dequantized(args[1], args[2], block), [2, 3])) <= 1e-6


@pytest.mark.parametrize("block, dtype", [((128, 128), jnp.bfloat16), ((0, 1), jnp.float32)])
def test_lowers_to_triton_for_cuda(block, dtype):
    """The Triton lowering (no PTX) of an odd shape: 5 experts, K 200, N 300."""
    groups, k, n = 5, 200, 300
    args = (
        jax.ShapeDtypeStruct((17, k), dtype),
        jax.ShapeDtypeStruct((groups, k, n), jnp.float8_e4m3fn),
        jax.ShapeDtypeStruct((groups, *scale_shape(k, n, block)), jnp.float32),
        jax.ShapeDtypeStruct((groups,), jnp.int32),
    )
    text = lower_for_cuda(functools.partial(fp8_grouped_matmul, block=block), *args)
    assert "triton" in text
