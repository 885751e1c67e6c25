"""Grid points of the paged attention kernels: decode lanes and prefill tokens, over a KV pool in
the queries' dtype or in FP8 (`kv_cache="fp8"`: e4m3 pools written by `quantize_kv` with scales
other than 1, which kernel and reference read back times the same scales)."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np

from benchmarks.checks.kernels.case import TOLERANCE, Case, Shape
from benchmarks.checks.kernels.layouts import block_table, normal, random_pool
from pallas_kernels.attention import decode as pda
from pallas_kernels.attention import prefill as ppa
from pallas_kernels.attention import reference as attention_ref

FP8_SCALES = {"k_scale": 0.75, "v_scale": 1.25}  # not powers of two: the scales' arithmetic shows


def kv_pools(rng, num_blocks: int, tail: tuple[int, ...], dtype, kv_cache: str) -> tuple:
    """(k, v, scales): random pools (NaN in the NULL block) in `dtype`, or quantized to e4m3
    with FP8_SCALES for `kv_cache` "fp8" (NaN stays NaN)."""
    k, v = (random_pool(rng, num_blocks, tail, dtype) for _ in range(2))
    if kv_cache == "auto":
        return k, v, {}
    e4m3 = jnp.float8_e4m3fn
    k = np.asarray(attention_ref.quantize_kv(jnp.asarray(k), e4m3, FP8_SCALES["k_scale"]))
    v = np.asarray(attention_ref.quantize_kv(jnp.asarray(v), e4m3, FP8_SCALES["v_scale"]))
    return k, v, FP8_SCALES


def paged_decode(
    width: int,
    heads: int,
    kv_heads: int,
    head_dim: int,
    block_size: int,
    dtype,
    contexts: tuple[int, ...],
    kv_cache: str = "auto",
) -> Shape:
    """Decode rows of `width` lanes at the given context lengths (the last lane of each row dead
    when width > 1), a padding row, NaN in the NULL block; the caches play the pool's part: no
    block may change and block 0 stays NaN. `kv_cache`: "auto" or "fp8" (`kv_pools`)."""

    def build(rng) -> Case:
        rows = len(contexts) + 1
        table, num_blocks = block_table(rng, list(contexts), block_size, rows)
        seq_lens, query_lens = np.zeros(rows, np.int32), np.zeros(rows, np.int32)
        for r, length in enumerate(contexts):
            seq_lens[r], query_lens[r] = length, max(1, min(width - 1, length))
        k, v, scales = kv_pools(rng, num_blocks, (block_size, kv_heads, head_dim), dtype, kv_cache)
        args = (
            normal(rng, (rows, width, heads, head_dim), dtype),
            k,
            v,
            table,
            seq_lens,
            query_lens,
        )
        scale = head_dim**-0.5

        def kernel(*a, interpret):
            out = pda.paged_decode_attention(*a, scale=scale, interpret=interpret, **scales)
            return out, a[1]

        def reference(*a):
            out = attention_ref.paged_decode_attention_reference(*a, scale=scale, **scales)
            return out, a[1]

        live = (np.arange(width)[None, :] < query_lens[:, None])[:, :, None, None]
        return Case(
            kernel,
            reference,
            args,
            1,
            live,
            np.zeros(0, np.int32),
            TOLERANCE[dtype, "update"],
            f"contexts={list(contexts)} W={width}",
        )

    return Shape(
        f"paged_decode_attention Hq={heads} Hkv={kv_heads} D={head_dim} bs={block_size} "
        f"W={width} {jnp.dtype(dtype).name}{_pool_name(kv_cache)}",
        build,
    )


def paged_prefill(
    heads: int,
    kv_heads: int,
    head_dim: int,
    block_size: int,
    dtype,
    rows: tuple[tuple[int, int], ...],
    kv_cache: str = "auto",
) -> Shape:
    """Prefill rows of (tokens cached before, tokens of this chunk), then 5 padding tokens, NaN
    in the NULL block; no block may change and block 0 stays NaN. `kv_cache`: "auto" or "fp8"
    (`kv_pools`)."""

    def build(rng) -> Case:
        table, num_blocks = block_table(rng, [a + b for a, b in rows], block_size, len(rows))
        tokens = sum(b for _, b in rows) + 5
        token_rows, positions = np.zeros(tokens, np.int32), np.zeros(tokens, np.int32)
        valid, t = np.zeros(tokens, bool), 0
        for r, (cached, new) in enumerate(rows):
            token_rows[t : t + new], positions[t : t + new] = r, cached + np.arange(new)
            valid[t : t + new], t = True, t + new
        k, v, scales = kv_pools(rng, num_blocks, (block_size, kv_heads, head_dim), dtype, kv_cache)
        q = normal(rng, (tokens, heads, head_dim), dtype)
        args = (q, k, v, table, token_rows, positions, valid)
        scale = head_dim**-0.5

        def kernel(*a, interpret):
            out = ppa.paged_prefill_attention(*a, scale=scale, interpret=interpret, **scales)
            return out, a[1]

        def reference(*a):
            return attention_ref.paged_attention_reference(*a, scale=scale, **scales), a[1]

        return Case(
            kernel,
            reference,
            args,
            1,
            valid[:, None, None],
            np.zeros(0, np.int32),
            TOLERANCE[dtype, "update"],
            f"rows={list(rows)}",
        )

    return Shape(
        f"paged_prefill_attention Hq={heads} Hkv={kv_heads} D={head_dim} bs={block_size} "
        f"{jnp.dtype(dtype).name}{_pool_name(kv_cache)}",
        build,
    )


def _pool_name(kv_cache: str) -> str:
    return "" if kv_cache == "auto" else f" kv={kv_cache}"
