"""Prefill attention over the paged KV cache: each query reads only its own row's keys, up to its
own position, in tiles, with an online softmax (no [T, context] gather).

Shapes (the contract of `paged_attention_reference`, `attention/reference.py`):
  q:            [T, Hq, D]      prefill tokens (rows' tokens contiguous, padding last)
  k/v_cache:    [num_blocks, block_size, Hkv, D]   block 0 is the NULL block
  block_table:  [R, max_blocks] blocks of each row, NULL past the row's blocks
  token_rows:   [T]             row of each token
  positions:    [T]             absolute position of each token (it sees keys up to its own)
  valid:        [T] bool        False for padding tokens (their output is 0)
  -> out        [T, Hq, D]

The reference gathers `max_blocks * block_size` keys for every token: [T, C, Hkv, D], 69 GB for
one 8192-token prompt of the 80B shape. Here the tokens are cut into tiles: a tile is up to
`block_m // G` consecutive tokens of one row (G = Hq / Hkv; a tile never spans two rows, nor a
live token and a padding one). Program (tile, kv head) holds the tile's tokens x the G query
heads reading that KV head, walks the row's keys in tiles of `block_k` from position 0 up to the
tile's last position, and keeps a running max and sum per query (flash attention: the step it
shares with the decode kernel, `key_tiles.key_tile`). Tiles are
found on the device (`_tiles`) from token_rows and valid, so any ragged layout works.

A query's arithmetic does not depend on the other tokens of its tile or step: its key tiles are at
absolute positions, and a key tile wholly past its position changes neither its max nor its sums
(every score masked: p = 0 exactly, the rescale factor exp(0) = 1), so chunking a prompt
differently gives the same bits (docs/architecture.md 5.7, 5.8). A block id outside
[1, num_blocks) and a row outside the table contribute no keys. An FP8 cache is read as
`key_tiles` says (cast on load, k_scale / v_scale applied).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plgpu

from pallas_kernels._common import pow2
from pallas_kernels.attention.key_tiles import PagedKeys, empty_carry, key_tile
from pallas_kernels.attention.reference import check_prefill_args


def _tiles(token_rows: jax.Array, valid: jax.Array, tokens_per_tile: int, num_rows: int):
    """(start, end) [NT] of each tile of consecutive tokens sharing one row (padding tokens: one
    key of their own), at most `tokens_per_tile` long; unused tiles are (T, T). NT bounds the
    count: ceil(T / tokens_per_tile) + one per row change (at most R + 1 of them)."""
    num_tokens = token_rows.shape[0]
    key = jnp.where(valid, token_rows, -1)
    t = jnp.arange(num_tokens)
    change = jnp.concatenate([jnp.ones((1,), bool), key[1:] != key[:-1]])
    segment_start = jax.lax.cummax(jnp.where(change, t, 0))
    starts = change | ((t - segment_start) % tokens_per_tile == 0)
    num_tiles = pl.cdiv(num_tokens, tokens_per_tile) + num_rows + 1
    (start,) = jnp.nonzero(starts, size=num_tiles, fill_value=num_tokens)
    end = jnp.concatenate([start[1:], jnp.full((1,), num_tokens, start.dtype)])
    return start.astype(jnp.int32), end.astype(jnp.int32)


def _kernel(
    start_ref,
    end_ref,
    rows_ref,
    pos_ref,
    valid_ref,
    table_ref,
    q_ref,
    k_ref,
    v_ref,
    o_ref,
    *,
    keys: PagedKeys,
    num_tokens,
    group,
    head_dim,
    num_rows,
    block_m,
    block_d,
):
    i, h = pl.program_id(0), pl.program_id(1)
    start, end = start_ref[i], end_ref[i]
    first = jnp.minimum(start, num_tokens - 1)  # the tile's first token (any, for an unused tile)
    m = jnp.arange(block_m)
    token = start + m // group
    member = (m < (block_m // group) * group) & (token < end)
    safe_token = jnp.where(member, token, 0)
    row = rows_ref[first]
    live_row = (row >= 0) & (row < num_rows)
    query = member & (valid_ref[first] > 0) & live_row
    position = plgpu.load(pos_ref.at[safe_token], mask=query, other=0)  # [BM]
    cols = jnp.arange(block_d)
    dmask = cols < head_dim
    flat_q = (safe_token * keys.num_kv_heads + h) * group + m % group  # row of q / o: [T * Hq, D]
    q = plgpu.load(
        q_ref.at[flat_q[:, None], cols[None, :]], mask=query[:, None] & dmask[None, :], other=0.0
    )
    last = jnp.max(jnp.where(query, position, -1))
    capacity = pl.cdiv(keys.max_blocks * keys.block_size, keys.block_k)
    num_tiles = jnp.minimum(pl.cdiv(last + 1, keys.block_k), capacity)
    tile = functools.partial(
        key_tile,
        keys=keys,
        refs=(table_ref, k_ref, v_ref),
        row=jnp.where(live_row, row, 0),
        head=h,
        q=q,
        position=position,
        live_query=query,
        limit=last + 1,
    )
    init = empty_carry(block_m, block_d)
    acc, _, l_i = jax.lax.fori_loop(0, jnp.maximum(num_tiles, 0), tile, init)
    out = jnp.where((l_i > 0)[:, None], acc / jnp.where(l_i > 0, l_i, 1.0)[:, None], 0.0)
    out = keys.v_scale * out
    # Lanes that are not the tile's write rows past the output (sliced off): an interpreted
    # masked store still scatters every lane, and two lanes on one row would race.
    flat_o = jnp.where(member, flat_q, num_tokens * keys.num_kv_heads * group + m)
    plgpu.store(
        o_ref.at[flat_o[:, None], cols[None, :]],
        out.astype(o_ref.dtype),
        mask=member[:, None] & dmask[None, :],
    )


@functools.partial(
    jax.jit,
    static_argnames=(
        "scale",
        "k_scale",
        "v_scale",
        "interpret",
        "block_m",
        "block_k",
        "num_warps",
        "num_stages",
    ),
)
def paged_prefill_attention(
    q,
    k_cache,
    v_cache,
    block_table,
    token_rows,
    positions,
    valid,
    *,
    scale: float,
    k_scale: float = 1.0,
    v_scale: float = 1.0,
    interpret: bool = False,
    block_m: int = 64,
    block_k: int = 64,
    num_warps: int = 4,
    num_stages: int = 2,
):
    """Pallas prefill attention; same contract as `paged_attention_reference`.

    Tuning (static, never from the batch): block_m (query rows per program: block_m // G tokens
    x G heads, at least one token), block_k (keys per tile, a power of two >= 16), num_warps,
    num_stages.
    """
    check_prefill_args(q, k_cache, v_cache, block_table, token_rows, positions, valid)
    num_tokens, num_heads, head_dim = q.shape
    num_kv_heads = k_cache.shape[2]
    num_rows = block_table.shape[0]
    group = num_heads // num_kv_heads
    block_m = max(16, pow2(max(block_m, group)))
    tokens_per_tile = block_m // group
    block_d, block_k = max(16, pow2(head_dim)), max(16, pow2(block_k))
    start, end = _tiles(token_rows, valid, tokens_per_tile, num_rows)
    keys = PagedKeys.of(
        q, k_cache, block_table, block_k=block_k, scale=scale, k_scale=k_scale, v_scale=v_scale
    )
    kernel = functools.partial(
        _kernel,
        keys=keys,
        num_tokens=num_tokens,
        group=group,
        head_dim=head_dim,
        num_rows=num_rows,
        block_m=block_m,
        block_d=block_d,
    )
    out = pl.pallas_call(
        kernel,
        out_shape=jax.ShapeDtypeStruct((num_tokens * num_heads + block_m, head_dim), q.dtype),
        grid=(start.shape[0], num_kv_heads),
        compiler_params=plgpu.CompilerParams(num_warps=num_warps, num_stages=num_stages),
        interpret=interpret,
        name="paged_prefill_attention",
    )(
        start,
        end,
        token_rows.astype(jnp.int32),
        positions.astype(jnp.int32),
        valid.astype(jnp.int32),
        block_table.astype(jnp.int32).reshape(-1, 1),
        q.reshape(num_tokens * num_heads, head_dim),
        k_cache.reshape(-1, head_dim),
        v_cache.reshape(-1, head_dim),
    )
    return out[: num_tokens * num_heads].reshape(q.shape)
