"""Causal softmax attention of ragged queries over a paged KV cache, and the KV write, in plain jnp.

The references of the decode kernel (`attention/decode.py`, `paged_decode_attention_reference`)
and the prefill kernel (`attention/prefill.py`, `paged_attention_reference`), and `write_kv`,
which has no kernel and runs as plain jnp on every platform.

A cache may be stored in a narrower dtype than the queries (an FP8 KV cache: float8_e4m3fn, as
vLLM's `--kv-cache-dtype fp8`). `write_kv` stores k / k_scale and v / v_scale clipped to the
cache dtype's range (`quantize_kv`); every read casts a key back and multiplies it by k_scale (a
value by v_scale), here and in the kernels. The scales are static floats, one per layer (vLLM's
`k_scale` / `v_scale`), 1.0 by default: values clipped to +-448 and cast.

Shapes:
  q:            [T, Hq, Dh]  queries (decode lanes or prefill tokens, flattened)
  k/v_cache:    [num_blocks, block_size, Hkv, Dh]  block 0 is the NULL block
  block_table:  [R, max_blocks]  blocks of each row, NULL past the row's blocks
  token_rows:   [T] row of each query
  positions:    [T] absolute position of each query; it sees keys at positions <= its own
  valid:        [T] bool, False for padding queries (their output is 0)

Query head h reads KV head h // (Hq // Hkv). Every index is range-checked on the device
(docs/architecture.md section 5: a gather clamps an out-of-range index to a live row, and -1
wraps): a block id outside [1, num_blocks) contributes no keys, a kv slot outside the pool writes
nothing, and a row index outside the block table reads an all-NULL row. The reference gathers each
query's row of keys ([T, max_blocks * block_size, Hkv, Dh]): fine for tests, far too large for a
long prompt, which is why the kernels exist.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from pallas_kernels._common import check_shape

NULL = 0
_HIGHEST = jax.lax.Precision.HIGHEST  # fp32 scores and sums, not TF32


def quantize_kv(x: jax.Array, dtype: jnp.dtype, scale: float = 1.0) -> jax.Array:
    """`x` as a cache of `dtype` holds it: x / scale, clipped to the range of a one-byte (FP8)
    dtype (past e4m3's +-448 a cast gives NaN: float8_e4m3fn has no infinity), cast."""
    if scale != 1.0:
        x = x.astype(jnp.float32) / scale
    if jnp.dtype(dtype).itemsize == 1:
        top = float(jnp.finfo(dtype).max)
        x = jnp.clip(x, -top, top)
    return x.astype(dtype)


def write_kv(
    k_cache: jax.Array,
    v_cache: jax.Array,
    k: jax.Array,
    v: jax.Array,
    kv_slots: jax.Array,
    valid: jax.Array,
    *,
    k_scale: float = 1.0,
    v_scale: float = 1.0,
) -> tuple[jax.Array, jax.Array]:
    """Store k, v [T, Hkv, Dh] at flat slots `block * block_size + offset`, in the caches' dtype
    (`quantize_kv` with `k_scale` / `v_scale`).

    Padding tokens (valid False) and slots outside the pool write nothing (a scatter in drop mode),
    so the NULL block and every other block stay bit-identical.
    """

    def write(cache: jax.Array, new: jax.Array, scale: float) -> jax.Array:
        flat = jnp.asarray(cache).reshape(-1, *cache.shape[2:])
        size = flat.shape[0]
        target = jnp.where(valid & (kv_slots >= 0) & (kv_slots < size), kv_slots, size)
        flat = flat.at[target].set(quantize_kv(new, cache.dtype, scale), mode="drop")
        return flat.reshape(cache.shape)

    return write(k_cache, k, k_scale), write(v_cache, v, v_scale)


def paged_attention_reference(
    q: jax.Array,
    k_cache: jax.Array,
    v_cache: jax.Array,
    block_table: jax.Array,
    token_rows: jax.Array,
    positions: jax.Array,
    valid: jax.Array,
    *,
    scale: float,
    k_scale: float = 1.0,
    v_scale: float = 1.0,
) -> jax.Array:
    """Attention of every query over its row's cached keys up to its own position: [T, Hq, Dh];
    cached keys and values read as fp32 times `k_scale` / `v_scale`."""
    check_prefill_args(q, k_cache, v_cache, block_table, token_rows, positions, valid)
    num_tokens, num_heads, head_dim = q.shape
    num_kv_heads = k_cache.shape[2]
    group = num_heads // num_kv_heads
    num_blocks, block_size = k_cache.shape[0], k_cache.shape[1]
    # 1. Gather each query's row of keys and values: [T, C, Hkv, Dh], C = max_blocks * block_size.
    #    Indices out of range read the NULL row / block, and keys of such blocks are masked below.
    rows_ok = (token_rows >= 0) & (token_rows < block_table.shape[0])
    blocks = (
        jnp.asarray(block_table)
        .at[jnp.where(rows_ok, token_rows, block_table.shape[0])]
        .get(mode="fill", fill_value=NULL)
    )
    live_block = (blocks > NULL) & (blocks < num_blocks)
    blocks = jnp.where(live_block, blocks, NULL)
    keys = k_cache[blocks].reshape(num_tokens, -1, num_kv_heads, head_dim)
    values = v_cache[blocks].reshape(num_tokens, -1, num_kv_heads, head_dim)
    keys, values = keys.astype(jnp.float32) * k_scale, values.astype(jnp.float32) * v_scale
    # 2. Causal mask by absolute position, over live blocks only; masked values are zeroed so NaNs
    #    in unused blocks (the NULL block) cannot reach the output through 0 * NaN.
    live_key = jnp.repeat(live_block, block_size, axis=1)
    mask = (jnp.arange(keys.shape[1])[None, :] <= positions[:, None]) & valid[:, None] & live_key
    values = jnp.where(mask[..., None, None], values, 0.0)
    # 3. Scores per query head, softmax over keys, weighted sum of values.
    qg = q.astype(jnp.float32).reshape(num_tokens, num_kv_heads, group, head_dim)
    scores = jnp.einsum("tkgd,tckd->tkgc", qg, keys, precision=_HIGHEST)
    scores = scores * scale
    scores = jnp.where(mask[:, None, None, :], scores, -1e30)
    probs = jax.nn.softmax(scores, axis=-1)
    out = jnp.einsum("tkgc,tckd->tkgd", probs, values, precision=_HIGHEST).reshape(
        num_tokens, num_heads, head_dim
    )
    return jnp.where(valid[:, None, None], out, 0.0).astype(q.dtype)


def check_prefill_args(q, k_cache, v_cache, block_table, token_rows, positions, valid) -> None:
    """Raise ValueError unless q [T, Hq, D], k/v_cache [num_blocks, block_size, Hkv, D],
    block_table [R, max_blocks], token_rows, positions and valid [T], and Hkv divides Hq."""
    num_tokens, num_heads, head_dim = q.shape
    num_kv_heads = k_cache.shape[2]
    check_shape("k_cache", k_cache, (None, None, None, head_dim))
    check_shape("v_cache", v_cache, k_cache.shape)
    check_shape("block_table", block_table, (None, None))
    for name, array in (("token_rows", token_rows), ("positions", positions), ("valid", valid)):
        check_shape(name, array, (num_tokens,))
    if num_heads % num_kv_heads:
        raise ValueError(f"q has {num_heads} heads, not a multiple of {num_kv_heads} KV heads")


def check_decode_args(q, k_cache, v_cache, block_table, seq_lens, query_lens) -> None:
    """Raise ValueError unless q [R, W, Hq, D], k/v_cache [num_blocks, block_size, Hkv, D],
    block_table [R, max_blocks], seq_lens and query_lens [R], and Hkv divides Hq."""
    num_rows, width, num_heads, head_dim = q.shape
    num_kv_heads = k_cache.shape[2]
    check_shape("k_cache", k_cache, (None, None, None, head_dim))
    check_shape("v_cache", v_cache, k_cache.shape)
    check_shape("block_table", block_table, (num_rows, None))
    check_shape("seq_lens", seq_lens, (num_rows,))
    check_shape("query_lens", query_lens, (num_rows,))
    if num_heads % num_kv_heads:
        raise ValueError(f"q has {num_heads} heads, not a multiple of {num_kv_heads} KV heads")
    del width


def paged_decode_attention_reference(
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
):
    """Decode attention of q [R, W, Hq, D] (see `attention/decode.py`): the ragged reference on
    the decode lanes, lane t of row r at position seq_lens[r] - query_lens[r] + t."""
    check_decode_args(q, k_cache, v_cache, block_table, seq_lens, query_lens)
    num_rows, width, num_heads, head_dim = q.shape
    lane = jnp.arange(width)[None, :]
    positions = (seq_lens - query_lens)[:, None] + lane  # [R, W]
    valid = lane < query_lens[:, None]
    rows = jnp.repeat(jnp.arange(num_rows, dtype=jnp.int32), width)
    out = paged_attention_reference(
        q.reshape(num_rows * width, num_heads, head_dim),
        k_cache,
        v_cache,
        block_table,
        rows,
        jnp.where(valid, positions, 0).reshape(-1),
        valid.reshape(-1),
        scale=scale,
        k_scale=k_scale,
        v_scale=v_scale,
    )
    return out.reshape(q.shape)
