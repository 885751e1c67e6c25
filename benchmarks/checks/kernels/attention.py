"""Grid points of the paged decode attention kernel."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np

from benchmarks.checks.kernels.case import TOLERANCE, Case, Shape
from benchmarks.checks.kernels.layouts import normal, random_pool
from pallas_kernels.attention import decode as pda
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
        max_blocks = -(-max(contexts) // block_size)
        num_blocks = rows * max_blocks + 2
        table = np.zeros((rows, max_blocks), np.int32)
        free = list(rng.permutation(np.arange(1, num_blocks)))
        seq_lens, query_lens = np.zeros(rows, np.int32), np.zeros(rows, np.int32)
        for r, length in enumerate(contexts):
            n = -(-length // block_size)
            table[r, :n] = [free.pop() for _ in range(n)]
            seq_lens[r], query_lens[r] = length, max(1, min(width - 1, length))
        cache = (num_blocks, block_size, kv_heads, head_dim)
        k, v = (
            random_pool(rng, num_blocks, cache[1:], dtype),
            random_pool(rng, num_blocks, cache[1:], dtype),
        )
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
