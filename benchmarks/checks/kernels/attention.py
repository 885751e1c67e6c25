"""Grid points of the paged attention kernels: decode lanes and prefill tokens."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np

from benchmarks.checks.kernels.case import TOLERANCE, Case, Shape
from benchmarks.checks.kernels.layouts import block_table, normal, random_pool
from pallas_kernels.attention import decode as pda
from pallas_kernels.attention import prefill as ppa
from pallas_kernels.attention import reference as attention_ref


def paged_decode(
    width: int,
    heads: int,
    kv_heads: int,
    head_dim: int,
    block_size: int,
    dtype,
    contexts: tuple[int, ...],
) -> Shape:
    """Decode rows of `width` lanes at the given context lengths (the last lane of each row dead
    when width > 1), a padding row, NaN in the NULL block; the caches play the pool's part: no
    block may change and block 0 stays NaN."""

    def build(rng) -> Case:
        rows = len(contexts) + 1
        table, num_blocks = block_table(rng, list(contexts), block_size, rows)
        seq_lens, query_lens = np.zeros(rows, np.int32), np.zeros(rows, np.int32)
        for r, length in enumerate(contexts):
            seq_lens[r], query_lens[r] = length, max(1, min(width - 1, length))
        cache = (num_blocks, block_size, kv_heads, head_dim)
        k, v = (random_pool(rng, num_blocks, cache[1:], dtype) for _ in range(2))
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
            return pda.paged_decode_attention(*a, scale=scale, interpret=interpret), a[1]

        def reference(*a):
            return attention_ref.paged_decode_attention_reference(*a, scale=scale), a[1]

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
        f"W={width} {jnp.dtype(dtype).name}",
        build,
    )


def paged_prefill(
    heads: int,
    kv_heads: int,
    head_dim: int,
    block_size: int,
    dtype,
    rows: tuple[tuple[int, int], ...],
) -> Shape:
    """Prefill rows of (tokens cached before, tokens of this chunk), then 5 padding tokens, NaN
    in the NULL block; no block may change and block 0 stays NaN."""

    def build(rng) -> Case:
        table, num_blocks = block_table(rng, [a + b for a, b in rows], block_size, len(rows))
        tokens = sum(b for _, b in rows) + 5
        token_rows, positions = np.zeros(tokens, np.int32), np.zeros(tokens, np.int32)
        valid, t = np.zeros(tokens, bool), 0
        for r, (cached, new) in enumerate(rows):
            token_rows[t : t + new], positions[t : t + new] = r, cached + np.arange(new)
            valid[t : t + new], t = True, t + new
        cache = (num_blocks, block_size, kv_heads, head_dim)
        k, v = (random_pool(rng, num_blocks, cache[1:], dtype) for _ in range(2))
        q = normal(rng, (tokens, heads, head_dim), dtype)
        args = (q, k, v, table, token_rows, positions, valid)
        scale = head_dim**-0.5

        def kernel(*a, interpret):
            return ppa.paged_prefill_attention(*a, scale=scale, interpret=interpret), a[1]

        def reference(*a):
            return attention_ref.paged_attention_reference(*a, scale=scale), a[1]

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
        f"{jnp.dtype(dtype).name}",
        build,
    )
