"""Bucket tables ("fine", "serving") and the buckets a step can reach (`BucketPolicy.reachable`):
`all_buckets` is exactly the set of buckets some schedule within the budgets rounds up to, found
here by enumerating every (decode rows, prefill rows, prefill tokens) a step may hold."""

from __future__ import annotations

import itertools

import pytest

from runtime.core.buckets import Bucket, BucketPolicy, round_up
from runtime.core.engine_args import EngineArgs


def resolved(**options) -> BucketPolicy:
    args = EngineArgs(max_model_len=256, block_size=4, num_blocks=512, **options)
    return BucketPolicy(args.resolved(chunk_size=8))


@pytest.mark.parametrize(
    ("seqs", "budget", "tables"),
    [
        (64, 512, ((4, 16, 64), (32, 128, 512), (1, 4, 16, 64))),
        (32, 8192, ((4, 16, 32), (32, 128, 512, 2048, 8192), (1, 4, 16, 32))),
        (3, 40, ((3,), (40,), (1, 3))),  # 40 / 4 = 10 is under the 16-token floor
        (1, 24, ((1,), (24,), (1,))),
    ],
)
def test_serving_tables_are_powers_of_four_ending_at_their_limits(seqs, budget, tables):
    policy = resolved(max_num_seqs=seqs, max_num_batched_tokens=budget, bucket_table="serving")
    assert (policy.decode_rows, policy.prefill_tokens, policy.prefill_rows) == tables


def test_fine_tables_are_powers_of_two_and_given_tables_win():
    fine = resolved(max_num_seqs=6, max_num_batched_tokens=40)
    assert (fine.decode_rows, fine.prefill_tokens, fine.prefill_rows) == (
        (2, 4, 8),
        (8, 16, 32, 64),
        (1, 2, 4, 8),
    )
    given = resolved(
        max_num_seqs=6,
        max_num_batched_tokens=40,
        bucket_table="serving",
        prefill_token_buckets=(10, 40),
    )
    assert given.prefill_tokens == (10, 40)
    assert given.decode_rows == (4, 6)


def test_an_unknown_table_or_one_too_short_is_refused():
    with pytest.raises(ValueError, match="bucket_table='coarse' must be one of"):
        EngineArgs(bucket_table="coarse")
    with pytest.raises(ValueError, match="decode_row_buckets"):
        EngineArgs(max_num_seqs=8, bucket_table="serving", decode_row_buckets=(4,))


def reached(policy: BucketPolicy, seqs: int, budget: int) -> set[Bucket]:
    """Every bucket of a step with d decode rows (one token each) and p prefill rows of t
    tokens in all (t >= p), d + p <= max_num_seqs rows, d + t <= budget tokens."""
    found = set()
    for d, p in itertools.product(range(seqs + 1), repeat=2):
        if d + p > seqs or d + p == 0:
            continue
        for t in range(p, budget - d + 1) if p else [0]:
            found.add(
                Bucket(
                    round_up(policy.decode_rows, d),
                    1,
                    round_up(policy.prefill_tokens, t),
                    round_up(policy.prefill_rows, p),
                )
            )
    return found


@pytest.mark.parametrize(
    "options",
    [
        dict(max_num_seqs=4, max_num_batched_tokens=16),
        dict(max_num_seqs=7, max_num_batched_tokens=21),
        dict(max_num_seqs=9, max_num_batched_tokens=40, bucket_table="serving"),
        dict(max_num_seqs=5, max_num_batched_tokens=12, prefill_token_buckets=(3, 7, 12)),
    ],
)
def test_all_buckets_are_exactly_those_a_step_reaches(options):
    policy = resolved(**options)
    buckets = policy.all_buckets()
    assert len(set(buckets)) == len(buckets) == policy.max_num_variants
    seqs, budget = options["max_num_seqs"], options["max_num_batched_tokens"]
    assert set(buckets) == reached(policy, seqs, budget)


def test_several_ranks_keep_every_combination():
    """Ranks agree on the elementwise max of their buckets: one rank's decode rows may meet
    another's prefill rows, so nothing is pruned."""
    one = resolved(max_num_seqs=4, max_num_batched_tokens=16)
    two = resolved(max_num_seqs=4, max_num_batched_tokens=16, data_parallel_size=2)
    combinations = (len(two.decode_rows) + 1) * len(two.prefill_tokens) * len(two.prefill_rows)
    assert two.max_num_variants == len(two.decode_rows) + combinations
    assert one.max_num_variants < two.max_num_variants
    assert Bucket(4, 1, 8, 4) in two.all_buckets()  # 3 + 3 rows: more than one rank holds
    assert Bucket(4, 1, 8, 4) not in one.all_buckets()


def test_num_programs_counts_buckets_modes_and_multi_step_programs():
    policy = resolved(max_num_seqs=4, max_num_batched_tokens=16, decode_steps=4)
    num_decode = len(policy.decode_buckets())
    assert policy.num_programs(True, sampled=False) == policy.max_num_variants + num_decode
    assert policy.num_programs(True, sampled=True) == 2 * policy.num_programs(True, False)
    merged = resolved(max_num_seqs=4, max_num_batched_tokens=16, one_sampler_program=True)
    assert merged.num_programs(True, sampled=True) == merged.max_num_variants
    assert merged.num_programs(False, sampled=True) == len(merged.decode_buckets())
