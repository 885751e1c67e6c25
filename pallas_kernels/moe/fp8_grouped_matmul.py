"""Weight-only FP8 grouped matmul, the routed experts of an FP8 checkpoint's MoE layer: rows
grouped by expert in their own dtype (bf16) times each expert's e4m3 weights with fp32 block
scales, every touched expert's weights read once per row tile as 1 byte an entry.

Shapes (M rows, K contraction, N output columns, G groups; scales as in `moe/fp8_reference.py`):
  lhs:          [M, K]          bf16 (fp16, fp32); rows of group g follow group g - 1's
  rhs:          [G, K, N]       float8_e4m3fn
  scale:        [G, G_k, G_n]   fp32, group g's scale grid in blocks of `block`
  group_sizes:  [G]             rows per group; rows past sum(group_sizes) belong to no group
  -> out        [M, N]          out[r] = lhs[r] @ (rhs[g(r)] * scale), fp32 accumulation; 0 for
                                rows in no group

The kernel of `moe/grouped_matmul.py` (program (g, N tile) walks group g's rows, reads nothing
for an empty group), with e4m3 weight tiles converted in registers to the rows' dtype (exact) and
the scales applied to the fp32 accumulator, never to the entries: with a scale that varies along
K (a checkpoint's 128 x 128 tiles), each K slice lies in one block (block_k divides the block's
rows, which must be a multiple of 16: `supports_block`) and its partial product is scaled before
it is summed; otherwise the tile's sum is scaled once. At decode sizes the experts' weights are
what is read, so reading half a bf16 stack's bytes is the point.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from pallas_kernels._common import pow2
from pallas_kernels.matmul.fp8_reference import Block, scale_shape
from pallas_kernels.moe.fp8_reference import check_fp8_args
from pallas_kernels.moe.grouped_matmul import GroupedMatmulTuning, launch

MIN_DOT_K = 16  # the smallest K slice a tensor-core dot takes
# On the H100 (2026-12-07, Qwen3-Next's up / gate experts, 512 x [2048, 512] in 128 x 128 blocks,
# 10 per token) 128-column tiles with K slices of one block, 3 stages and 8 warps took 59 / 93 /
# 261 us at B = 1 / 16 / 256 tokens, against 68 / 108 / 334 us with the bf16 kernel's knobs
# (64-column tiles, K slices of 64, 4 stages, 4 warps); 32-column tiles were slower from B = 16.
# Against the bf16 kernel on bf16 experts: 1.0x at B = 1 (52 us each; a first run 0.7x), 1.25x at
# 16, 1.45x at 64, 1.54x at 256 (48-63% of the FP8 bytes' roofline, bf16 75-83% of its own).
FP8_GROUPED_TUNING = GroupedMatmulTuning(block_n=128, block_k=128, num_warps=8, num_stages=3)


def k_groups(k_dim: int, block: Block) -> int:
    """How many scales a group's weights have along K (1: the scale does not vary along K)."""
    return scale_shape(k_dim, 1, (block[0], 0))[0]


def supports_block(k_dim: int, block: Block) -> bool:
    """Whether the kernel takes weights of K rows in `block`s: the scale does not vary along K,
    or the block's rows are a multiple of 16 (each K slice then lies in one block)."""
    return k_groups(k_dim, block) == 1 or block[0] % MIN_DOT_K == 0


@functools.partial(jax.jit, static_argnames=("block", "out_dtype", "tuning", "interpret"))
def fp8_grouped_matmul(
    lhs: jax.Array,
    rhs: jax.Array,
    scale: jax.Array,
    group_sizes: jax.Array,
    *,
    block: Block,
    out_dtype=jnp.float32,
    tuning: GroupedMatmulTuning = FP8_GROUPED_TUNING,
    interpret: bool = False,
) -> jax.Array:
    """Pallas kernel for `fp8_grouped_matmul_reference` (same arguments and result, within fp32
    rounding); tiles from the shapes and `tuning` alone, never from M. ValueError for a block the
    kernel does not take (`supports_block`)."""
    check_fp8_args(lhs, rhs, scale, group_sizes, block, out_dtype)
    num_groups, k_dim, _ = rhs.shape
    if not supports_block(k_dim, block):
        raise ValueError(
            f"block={block} with rhs of shape {tuple(rhs.shape)}: scales blocked along K need "
            f"block rows that are a multiple of {MIN_DOT_K} (the kernel's K slices lie in one "
            "block)"
        )
    groups_k = k_groups(k_dim, block)
    block_k = min(tuning.block_k, max(MIN_DOT_K, pow2(k_dim)))
    if groups_k > 1:
        block_k = min(block_k, block[0] & -block[0])  # a power of two dividing the block's rows
    flat = scale.reshape(num_groups * groups_k, scale.shape[2])
    return launch(
        lhs,
        rhs,
        (flat,),
        group_sizes,
        out_dtype,
        tuning,
        interpret,
        block_k,
        lhs.dtype,
        block=block,
        groups_k=groups_k,
    )
