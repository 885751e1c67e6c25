"""Decode attention over the paged KV cache: each row reads only its own blocks, up to its length.

Shapes (R decode rows of W = 1 + K lanes; lane t of a row sits at position
seq_len - query_len + t and sees every key at a position <= its own):
  q:            [R, W, Hq, D]     queries of the decode lanes
  k/v_cache:    [num_blocks, block_size, Hkv, D]   block 0 is the NULL block
  block_table:  [R, max_blocks]   blocks of each row, NULL past the row's blocks
  seq_lens:     [R]               tokens in the row's context after this step (0: padding row)
  query_lens:   [R]               live lanes of the row (lanes past it are padding: output 0)
  -> out        [R, W, Hq, D]

The reference (`paged_decode_attention_reference`, `attention/reference.py`) is the general
ragged reference of `paged_attention`, which gathers `max_blocks * block_size` keys for every
query whatever the row's real context. The kernel walks only the tiles of keys the row has:
program (row, kv head, split) keeps the W x G queries of one KV head (G = Hq / Hkv) in registers
and runs an online softmax over tiles of `block_k` keys (`key_tiles.key_tile`, gathered row by row
from the row's blocks, so any block_size works, 8 included).
Long contexts are split over `num_splits` programs per row whose partial results are merged after
the kernel; the split count is a static knob (never derived from the batch), so a row's arithmetic
does not depend on what else is in the step. A block id outside [1, num_blocks) contributes no keys.
An FP8 cache is read as `key_tiles` says (cast on load, k_scale / v_scale applied).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plgpu

from pallas_kernels._common import pow2
from pallas_kernels.attention.key_tiles import PagedKeys, empty_carry, key_tile
from pallas_kernels.attention.reference import check_decode_args

SPLIT_KEYS = 4096  # default: one program per this many keys of a row's capacity ...
MAX_SPLITS = 16  # ... and at most this many (long contexts at small batch still fill the GPU)


def _kernel(
    table_ref,
    seq_ref,
    qlen_ref,
    q_ref,
    k_ref,
    v_ref,
    o_ref,
    m_ref,
    l_ref,
    *,
    keys: PagedKeys,
    width,
    group,
    head_dim,
    block_m,
    block_d,
    tiles_per_split,
):
    r, h, split = pl.program_id(0), pl.program_id(1), pl.program_id(2)
    seq, qlen = seq_ref[r], qlen_ref[r]
    m = jnp.arange(block_m)
    lane = m // group
    live_query = (m < width * group) & (lane < qlen)
    position = seq - qlen + lane  # [BM] the lane's own position
    dmask = jnp.arange(block_d) < head_dim
    q = plgpu.load(
        q_ref.at[r, h, pl.ds(0, block_m), pl.ds(0, block_d)],
        mask=live_query[:, None] & dmask[None, :],
        other=0.0,
    )
    num_tiles = pl.cdiv(seq, keys.block_k)
    first = split * tiles_per_split
    last = jnp.minimum(first + tiles_per_split, num_tiles)
    tile = functools.partial(
        key_tile,
        keys=keys,
        refs=(table_ref, k_ref, v_ref),
        row=r,
        head=h,
        q=q,
        position=position,
        live_query=live_query,
        limit=seq,
    )
    init = empty_carry(block_m, block_d)
    acc, m_i, l_i = jax.lax.fori_loop(first, jnp.maximum(last, first), tile, init)
    plgpu.store(o_ref.at[split, r, h, pl.ds(0, block_m), pl.ds(0, block_d)], acc)
    plgpu.store(m_ref.at[split, r, h, pl.ds(0, block_m)], m_i)
    plgpu.store(l_ref.at[split, r, h, pl.ds(0, block_m)], l_i)


def _merge_splits(acc, m, sums):
    """Combine the splits' partial softmax sums: [S, R, Hkv, BM, BD] -> [R, Hkv, BM, BD]."""
    top = jnp.max(m, axis=0)
    weight = jnp.exp(m - top[None])  # [S, R, Hkv, BM]
    total = jnp.sum(sums * weight, axis=0)
    out = jnp.sum(acc * weight[..., None], axis=0)
    return jnp.where(total[..., None] > 0, out / jnp.where(total > 0, total, 1.0)[..., None], 0.0)


@functools.partial(
    jax.jit,
    static_argnames=(
        "scale",
        "k_scale",
        "v_scale",
        "interpret",
        "block_k",
        "num_splits",
        "num_warps",
        "num_stages",
    ),
)
def paged_decode_attention(
    q,
    k_cache,
    v_cache,
    block_table,
    seq_lens,
    query_lens,
    *,
    scale: float,
    k_scale: float = 1.0,
    v_scale: float = 1.0,
    interpret: bool = False,
    block_k: int = 64,
    num_splits: int | None = None,
    num_warps: int = 4,
    num_stages: int = 2,
):
    """Pallas decode attention; same contract as `paged_decode_attention_reference`.

    Tuning: block_k (keys per tile, a power of two >= 16), num_splits (programs per row over its
    context, merged after the kernel; None = one per `SPLIT_KEYS` keys of the table's capacity, a
    static shape: never the batch), num_warps, num_stages.
    """
    check_decode_args(q, k_cache, v_cache, block_table, seq_lens, query_lens)
    num_rows, width, num_heads, head_dim = q.shape
    _, block_size, num_kv_heads, _ = k_cache.shape
    group = num_heads // num_kv_heads
    max_blocks = block_table.shape[1]
    block_m, block_d = max(16, pow2(width * group)), max(16, pow2(head_dim))
    block_k = max(16, pow2(block_k))
    tiles = pl.cdiv(max_blocks * block_size, block_k)
    if num_splits is None:
        num_splits = min(MAX_SPLITS, pl.cdiv(max_blocks * block_size, SPLIT_KEYS))
    # [R, W, Hkv, G, D] -> [R, Hkv, W * G, D]: one program's queries are contiguous.
    qg = q.reshape(num_rows, width, num_kv_heads, group, head_dim).transpose(0, 2, 1, 3, 4)
    qg = qg.reshape(num_rows, num_kv_heads, width * group, head_dim)
    keys = PagedKeys.of(
        q, k_cache, block_table, block_k=block_k, scale=scale, k_scale=k_scale, v_scale=v_scale
    )
    kernel = functools.partial(
        _kernel,
        keys=keys,
        width=width,
        group=group,
        head_dim=head_dim,
        block_m=block_m,
        block_d=block_d,
        tiles_per_split=pl.cdiv(tiles, num_splits),
    )
    partial_shape = (num_splits, num_rows, num_kv_heads, block_m)
    acc, m, sums = pl.pallas_call(
        kernel,
        out_shape=(
            jax.ShapeDtypeStruct((*partial_shape, block_d), jnp.float32),
            jax.ShapeDtypeStruct(partial_shape, jnp.float32),
            jax.ShapeDtypeStruct(partial_shape, jnp.float32),
        ),
        grid=(num_rows, num_kv_heads, num_splits),
        compiler_params=plgpu.CompilerParams(num_warps=num_warps, num_stages=num_stages),
        interpret=interpret,
        name="paged_decode_attention",
    )(
        block_table.astype(jnp.int32).reshape(-1, 1),
        seq_lens.astype(jnp.int32),
        query_lens.astype(jnp.int32),
        qg,
        k_cache.reshape(-1, head_dim),
        v_cache.reshape(-1, head_dim),
    )
    out = keys.v_scale * _merge_splits(acc, m, sums)[:, :, : width * group, :head_dim]
    out = out.reshape(num_rows, num_kv_heads, width, group, head_dim).transpose(0, 2, 1, 3, 4)
    return out.reshape(q.shape).astype(q.dtype)
