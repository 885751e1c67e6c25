"""Paged decode attention: the kernel (interpret mode) against the ragged jnp reference.

Odd head dims and group sizes, block sizes below and above the key tile, rows of 1 + K lanes with
dead lanes, padding rows, NaN in the NULL block, out-of-range block ids (they must contribute
nothing), splits over the context, and a row's bitwise independence from the rest of the batch.
"""

from __future__ import annotations

import numpy as np
import pytest

from pallas_kernels.attention.decode import paged_decode_attention
from pallas_kernels.attention.reference import paged_decode_attention_reference

# (row context lengths, live lanes): a 1-token context, one just past a block, a full table, a
# padding row (0, 0) last.
ROWS = [(1, 1), (9, 2), (48, 1), (17, 3), (0, 0)]


def make_case(rng, *, width, heads, kv_heads, head_dim, block_size, dtype=np.float32):
    max_blocks = -(-max(s for s, _ in ROWS) // block_size)
    num_blocks = len(ROWS) * max_blocks + 3
    q = rng.standard_normal((len(ROWS), width, heads, head_dim)).astype(dtype)
    k = rng.standard_normal((num_blocks, block_size, kv_heads, head_dim)).astype(dtype)
    v = rng.standard_normal((num_blocks, block_size, kv_heads, head_dim)).astype(dtype)
    k[0], v[0] = np.nan, np.nan  # the NULL block
    table = np.zeros((len(ROWS), max_blocks), np.int32)
    free = list(rng.permutation(np.arange(1, num_blocks)))
    seq_lens, query_lens = np.zeros(len(ROWS), np.int32), np.zeros(len(ROWS), np.int32)
    for r, (length, lanes) in enumerate(ROWS):
        n = -(-length // block_size)
        table[r, :n] = [free.pop() for _ in range(n)]
        seq_lens[r], query_lens[r] = length, min(lanes, width)
    return q, k, v, table, seq_lens, query_lens


def run_both(case, **knobs):
    scale = case[0].shape[-1] ** -0.5
    out = np.asarray(
        paged_decode_attention(*case, scale=scale, interpret=True, **knobs), np.float32
    )
    ref = np.asarray(paged_decode_attention_reference(*case, scale=scale), np.float32)
    return out, ref


@pytest.mark.parametrize(
    "width, heads, kv_heads, head_dim, block_size, knobs",
    [
        (1, 4, 2, 16, 8, {}),
        (2, 6, 3, 24, 8, dict(block_k=16)),
        (3, 5, 1, 80, 16, dict(block_k=32, num_splits=3)),
        (4, 10, 5, 12, 32, dict(block_k=16, num_splits=2)),
    ],
)
def test_matches_reference_on_odd_shapes(width, heads, kv_heads, head_dim, block_size, knobs):
    rng = np.random.default_rng(width * 100 + head_dim)
    case = make_case(
        rng, width=width, heads=heads, kv_heads=kv_heads, head_dim=head_dim, block_size=block_size
    )
    out, ref = run_both(case, **knobs)
    assert np.isfinite(out).all()  # the NaN NULL block never reaches an output
    np.testing.assert_allclose(out, ref, atol=2e-6, rtol=1e-5)
    lane = np.arange(width)[None, :]
    assert (out[lane >= case[5][:, None]] == 0).all()  # dead lanes and padding rows are 0


def test_bfloat16_within_bf16_rounding():
    import ml_dtypes

    rng = np.random.default_rng(7)
    case = make_case(
        rng, width=2, heads=6, kv_heads=2, head_dim=48, block_size=16, dtype=ml_dtypes.bfloat16
    )
    out, ref = run_both(case)
    assert np.abs(out - ref).max() < 3e-2


def test_out_of_range_block_ids_contribute_no_keys():
    """Block ids -1, num_blocks and num_blocks + 7 in live rows act like NULL (no keys), exactly as
    if the table held 0 there."""
    rng = np.random.default_rng(3)
    case = make_case(rng, width=2, heads=4, kv_heads=2, head_dim=16, block_size=8)
    q, k, v, table, seq_lens, query_lens = case
    bad, null = table.copy(), table.copy()
    for value, (r, c) in zip(
        (-1, k.shape[0], k.shape[0] + 7), ((1, 1), (2, 3), (3, 2)), strict=True
    ):
        bad[r, c], null[r, c] = value, 0
    out_bad, _ = run_both((q, k, v, bad, seq_lens, query_lens))
    out_null, ref_null = run_both((q, k, v, null, seq_lens, query_lens))
    np.testing.assert_array_equal(out_bad, out_null)
    np.testing.assert_allclose(out_null, ref_null, atol=2e-6, rtol=1e-5)


def test_a_row_does_not_depend_on_its_batch():
    """Row 3 alone (row 0 of a batch of one) gives bitwise the same output as inside the batch."""
    rng = np.random.default_rng(5)
    case = make_case(rng, width=3, heads=6, kv_heads=3, head_dim=24, block_size=8)
    full, _ = run_both(case)
    alone, _ = run_both(tuple(a[3:4] if i in (0, 3, 4, 5) else a for i, a in enumerate(case)))
    np.testing.assert_array_equal(alone[0], full[3])
