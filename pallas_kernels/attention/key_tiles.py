"""One step of flash attention over a paged KV cache, shared by the decode and prefill kernels.

A program holds BM query rows (tokens or lanes x the query heads of one KV head) and walks one
row of the block table in tiles of `block_k` keys at absolute positions. `key_tile` adds tile j
to the running (acc [BM, BD], max [BM], sum [BM]): it gathers the tile's keys and values row by
row through the table (so any block_size works), masks keys past `limit`, in a NULL or
out-of-range block, or after a query's own position, and rescales. A tile wholly masked for a
query leaves that query's carry bit-identical (p = 0, rescale exp(0) = 1).

A cache narrower than the queries (FP8) is cast to the queries' dtype as it is loaded (e4m3 is
exact in bf16 and fp32); its `k_scale` is folded into the score scale and its `v_scale` is applied
to each kernel's output (softmax weights sum to 1, so v_scale * sum p v = sum p (v_scale v)).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
from jax.experimental.pallas import triton as plgpu

NEG = -1e30


@dataclasses.dataclass(frozen=True)
class PagedKeys:
    """Static shape of the paged cache as a kernel sees it: K / V flattened to
    [num_blocks * block_size * num_kv_heads, D], the table to [R * max_blocks, 1]."""

    block_size: int
    num_blocks: int
    max_blocks: int
    num_kv_heads: int
    block_k: int
    scale: float  # the softmax scale times k_scale
    v_scale: float
    precision: Any  # jax.lax.Precision.HIGHEST for fp32 operands, else None

    @classmethod
    def of(
        cls,
        q: jax.Array,
        k_cache: jax.Array,
        block_table: jax.Array,
        *,
        block_k: int,
        scale: float,
        k_scale: float,
        v_scale: float,
    ) -> PagedKeys:
        """The geometry of `k_cache` [num_blocks, block_size, Hkv, D] and `block_table`
        [R, max_blocks], key tiles of `block_k`, for queries `q` (fp32: HIGHEST precision), with
        the cache's dequantization scales."""
        num_blocks, block_size, num_kv_heads, _ = k_cache.shape
        return cls(
            block_size=block_size,
            num_blocks=num_blocks,
            max_blocks=block_table.shape[1],
            num_kv_heads=num_kv_heads,
            block_k=block_k,
            scale=float(scale) * float(k_scale),
            v_scale=float(v_scale),
            precision=jax.lax.Precision.HIGHEST if q.dtype == jnp.float32 else None,
        )


def empty_carry(block_m: int, block_d: int) -> tuple[jax.Array, jax.Array, jax.Array]:
    """(acc, running max, running sum) before the first tile."""
    return (
        jnp.zeros((block_m, block_d), jnp.float32),
        jnp.full((block_m,), NEG, jnp.float32),
        jnp.zeros((block_m,), jnp.float32),
    )


def key_tile(
    j,
    carry,
    *,
    keys: PagedKeys,
    refs: tuple,
    row,
    head,
    q: jax.Array,
    position: jax.Array,
    live_query: jax.Array,
    limit,
):
    """`carry` after key tile j of table row `row`, KV head `head`. refs = (table, k, v);
    q [BM, BD] (padded head dim columns zero), position / live_query [BM]; keys at positions
    >= `limit` count as absent."""
    table_ref, k_ref, v_ref = refs
    acc, m_i, l_i = carry
    block_d = q.shape[1]
    cols = jnp.arange(block_d)
    key = j * keys.block_k + jnp.arange(keys.block_k)  # absolute key positions of this tile
    column = jnp.minimum(key // keys.block_size, keys.max_blocks - 1)
    entry = (row * keys.max_blocks + column)[
        :, None
    ]  # a 2-D gather from the [R * max_blocks, 1] table
    block = plgpu.load(table_ref.at[entry, jnp.zeros((1, 1), jnp.int32)])[:, 0]
    live_key = (key < limit) & (block > 0) & (block < keys.num_blocks)
    offset = key % keys.block_size
    flat = (jnp.where(live_key, block, 0) * keys.block_size + offset) * keys.num_kv_heads + head
    kv_mask = live_key[:, None] & (cols < k_ref.shape[1])[None, :]
    k = plgpu.load(k_ref.at[flat[:, None], cols[None, :]], mask=kv_mask, other=0.0)
    v = plgpu.load(v_ref.at[flat[:, None], cols[None, :]], mask=kv_mask, other=0.0)
    dtype = q.dtype
    s = keys.scale * jax.lax.dot_general(
        q,
        k.astype(dtype),
        (((1,), (1,)), ((), ())),
        precision=keys.precision,
        preferred_element_type=jnp.float32,
    )
    visible = live_key[None, :] & (key[None, :] <= position[:, None]) & live_query[:, None]
    s = jnp.where(visible, s, NEG)
    m_new = jnp.maximum(m_i, jnp.max(s, axis=1))
    p = jnp.where(visible, jnp.exp(s - m_new[:, None]), 0.0)
    alpha = jnp.exp(m_i - m_new)
    pv = jax.lax.dot_general(
        p.astype(dtype),
        v.astype(dtype),
        (((1,), (0,)), ((), ())),
        precision=keys.precision,
        preferred_element_type=jnp.float32,
    )
    return acc * alpha[:, None] + pv, m_new, l_i * alpha + jnp.sum(p, axis=1)
