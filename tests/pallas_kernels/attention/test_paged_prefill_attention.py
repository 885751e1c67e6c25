"""Paged prefill attention: the kernel (interpret mode) against the ragged jnp reference.

Ragged prompts (one token, one just past a tile, chunks that start past position 0 of their row),
odd head dims and group sizes, block sizes below and above the key tile, padding tokens, NaN in
the NULL block, out-of-range block ids and rows, and a token's bitwise independence from how its
prompt was cut into chunks.
"""

from __future__ import annotations

import numpy as np
import pytest

from pallas_kernels.attention.prefill import paged_prefill_attention
from pallas_kernels.attention.reference import paged_attention_reference

# (tokens cached before this chunk, tokens of this chunk) per row; 3 padding tokens follow.
ROWS = [(0, 1), (0, 19), (13, 6), (40, 33), (5, 1)]
PADDING = 3


def make_case(rng, *, heads, kv_heads, head_dim, block_size, rows=ROWS, dtype=np.float32):
    max_blocks = -(-max(a + b for a, b in rows) // block_size)
    num_blocks = len(rows) * max_blocks + 3
    tokens = sum(b for _, b in rows) + PADDING
    q = rng.standard_normal((tokens, heads, head_dim)).astype(dtype)
    k = rng.standard_normal((num_blocks, block_size, kv_heads, head_dim)).astype(dtype)
    v = rng.standard_normal((num_blocks, block_size, kv_heads, head_dim)).astype(dtype)
    k[0], v[0] = np.nan, np.nan  # the NULL block
    table = np.zeros((len(rows), max_blocks), np.int32)
    free = list(rng.permutation(np.arange(1, num_blocks)))
    token_rows, positions = np.zeros(tokens, np.int32), np.zeros(tokens, np.int32)
    valid = np.zeros(tokens, bool)
    t = 0
    for r, (cached, new) in enumerate(rows):
        n = -(-(cached + new) // block_size)
        table[r, :n] = [free.pop() for _ in range(n)]
        token_rows[t : t + new], positions[t : t + new] = r, cached + np.arange(new)
        valid[t : t + new] = True
        t += new
    return q, k, v, table, token_rows, positions, valid


def run_both(case, **knobs):
    scale = case[0].shape[-1] ** -0.5
    out = np.asarray(paged_prefill_attention(*case, scale=scale, interpret=True, **knobs))
    ref = np.asarray(paged_attention_reference(*case, scale=scale))
    return out.astype(np.float32), ref.astype(np.float32)


@pytest.mark.parametrize(
    "heads, kv_heads, head_dim, block_size, knobs",
    [
        (4, 2, 16, 8, {}),
        (6, 3, 24, 8, dict(block_m=16, block_k=16)),
        (5, 1, 80, 16, dict(block_m=32, block_k=32)),
        (10, 5, 12, 32, dict(block_k=16)),
        (3, 3, 20, 16, dict(block_m=16)),
    ],
)
def test_matches_reference_on_odd_shapes(heads, kv_heads, head_dim, block_size, knobs):
    rng = np.random.default_rng(heads * 100 + head_dim)
    case = make_case(rng, heads=heads, kv_heads=kv_heads, head_dim=head_dim, block_size=block_size)
    out, ref = run_both(case, **knobs)
    assert np.isfinite(out).all()  # the NaN NULL block never reaches an output
    np.testing.assert_allclose(out, ref, atol=2e-6, rtol=1e-5)
    assert (out[~case[6]] == 0).all()  # padding tokens are 0


def test_bfloat16_within_bf16_rounding():
    import ml_dtypes

    rng = np.random.default_rng(7)
    case = make_case(rng, heads=6, kv_heads=2, head_dim=48, block_size=16, dtype=ml_dtypes.bfloat16)
    out, ref = run_both(case)
    assert np.abs(out - ref).max() < 3e-2


def test_out_of_range_block_ids_and_rows_contribute_no_keys():
    """Block ids -1, num_blocks and num_blocks + 7 act like NULL (no keys), exactly as if the
    table held 0 there; tokens of a row past the table get 0, like the reference."""
    rng = np.random.default_rng(3)
    q, k, v, table, token_rows, positions, valid = make_case(
        rng, heads=4, kv_heads=2, head_dim=16, block_size=8
    )
    bad, null = table.copy(), table.copy()
    for value, (r, c) in zip(
        (-1, k.shape[0], k.shape[0] + 7), ((1, 1), (3, 3), (3, 2)), strict=True
    ):
        bad[r, c], null[r, c] = value, 0
    out_bad, _ = run_both((q, k, v, bad, token_rows, positions, valid))
    out_null, ref_null = run_both((q, k, v, null, token_rows, positions, valid))
    np.testing.assert_array_equal(out_bad, out_null)
    np.testing.assert_allclose(out_null, ref_null, atol=2e-6, rtol=1e-5)
    far = token_rows.copy()
    far[token_rows == 4] = len(table) + 2
    out_far, ref_far = run_both((q, k, v, table, far, positions, valid))
    assert (out_far[far > len(table)] == 0).all() and (ref_far[far > len(table)] == 0).all()


def test_a_token_does_not_depend_on_its_chunking():
    """Row 3's 33 tokens in one chunk, or as 7 + 26 tokens in two steps (the second beside other
    rows), give bitwise the same outputs: key tiles sit at absolute positions."""
    rng = np.random.default_rng(5)
    case = make_case(rng, heads=6, kv_heads=3, head_dim=24, block_size=8)
    q, k, v, table, token_rows, positions, valid = case
    whole, _ = run_both(case)
    mine = token_rows == 3
    first = np.flatnonzero(mine)[:7]
    rest = np.flatnonzero(mine)[7:]

    def alone(index):  # these tokens of row 3, as row 0 of a one-row step
        rows = np.zeros(len(index), np.int32)
        return (q[index], k, v, table[3:4], rows, positions[index], valid[index])

    out_first, _ = run_both(alone(first))
    out_rest, _ = run_both(alone(rest))
    np.testing.assert_array_equal(out_first, whole[first])
    np.testing.assert_array_equal(out_rest, whole[rest])


def test_bad_shapes_name_the_argument():
    rng = np.random.default_rng(0)
    q, k, v, table, token_rows, positions, valid = make_case(
        rng, heads=4, kv_heads=2, head_dim=16, block_size=8
    )
    with pytest.raises(ValueError, match="positions has shape"):
        paged_prefill_attention(
            q, k, v, table, token_rows, positions[:-1], valid, scale=1.0, interpret=True
        )
    with pytest.raises(ValueError, match="not a multiple of 3 KV heads"):
        paged_prefill_attention(
            q,
            k[:, :, :1].repeat(3, 2),
            v[:, :, :1].repeat(3, 2),
            table,
            token_rows,
            positions,
            valid,
            scale=1.0,
            interpret=True,
        )
