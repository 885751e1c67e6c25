"""Bucket tables: the padded sizes a step's rows and prefill tokens round up to, by default.

Each bucket of (decode rows, prefill tokens, prefill rows) is one compiled program, so the
tables trade padding (a step computes up to its bucket's size) against how many programs exist
and must be compiled or loaded before a server can run every step it meets:

- "fine" (`LLM`'s and `jmamba generate`'s default): powers of two. Little padding, many
  programs (the 0.87B bench shape at max_num_seqs = 64 and its 512-token budget: 303).
- "serving" (`jmamba serve`'s): powers of four, each table ending exactly at its limit. Up to
  3x the padding of a step, a few dozen programs (the same shape: 51), so
  `--warmup all` warms every program the server can ever run. A decode step of a small batch
  is bound by reading the weights, not by its rows; a short prompt's prefill pads to 32 tokens.

Tables given explicitly (`EngineArgs.decode_row_buckets`, ...) replace the named one's.
"""

from __future__ import annotations

from typing import NamedTuple

from runtime.core.budgets import powers_of_two_up_to

BUCKET_TABLES = ("fine", "serving")
SERVING_RATIO = 4  # each size of a "serving" table is 4x the one before
SERVING_MIN_TOKENS = 16  # its prefill token table stops before going under this


class BucketTables(NamedTuple):
    """The three tables of one engine (sorted, each reaching its limit)."""

    decode_rows: tuple[int, ...]
    prefill_tokens: tuple[int, ...]
    prefill_rows: tuple[int, ...]


def default_tables(table: str, max_num_seqs: int, budget: int) -> BucketTables:
    """The tables named `table` for `max_num_seqs` rows and a token `budget`."""
    if table == "serving":
        return BucketTables(
            decode_rows=_up_to(max_num_seqs, start=SERVING_RATIO),
            prefill_tokens=_down_from(budget),
            prefill_rows=_up_to(max_num_seqs, start=1),
        )
    return BucketTables(
        decode_rows=powers_of_two_up_to(max_num_seqs, start=2),
        prefill_tokens=powers_of_two_up_to(budget, 8),
        prefill_rows=powers_of_two_up_to(max_num_seqs),
    )


def _up_to(limit: int, start: int) -> tuple[int, ...]:
    """start, 4 start, 16 start, ... below `limit`, then `limit`."""
    sizes = []
    size = start
    while size < limit:
        sizes.append(size)
        size *= SERVING_RATIO
    return (*sizes, limit)


def _down_from(budget: int) -> tuple[int, ...]:
    """budget, budget / 4, budget / 16, ... while at least SERVING_MIN_TOKENS, ascending."""
    sizes = [budget]
    while sizes[-1] // SERVING_RATIO >= SERVING_MIN_TOKENS:
        sizes.append(sizes[-1] // SERVING_RATIO)
    return tuple(reversed(sizes))
