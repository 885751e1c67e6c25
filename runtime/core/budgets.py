"""Token budgets and bucket sizes: the powers of two that bucket tables are made of, and the
smallest and the derived token budget of a step (`EngineArgs.max_num_batched_tokens`)."""

from __future__ import annotations

DEFAULT_MIN_TOKEN_BUDGET = 256  # the smallest derived token budget (the tiny presets get this)


def powers_of_two_up_to(limit: int, start: int = 1) -> tuple[int, ...]:
    """Return (start, 2*start, 4*start, ...) with the last entry >= limit."""
    sizes = [start]
    while sizes[-1] < limit:
        sizes.append(sizes[-1] * 2)
    return tuple(sizes)


def min_token_budget(chunk_size: int, max_num_seqs: int) -> int:
    """The smallest token budget with room for one full prefill chunk beside a full decode batch.

    A step holds at most max_num_seqs rows; when one of them is a prefill, at most
    max_num_seqs - 1 decode lanes run beside it. The scheduler's fairness bound rests on this.
    `chunk_size` is the scheduler's alignment: the model's chunk size, or the state block size
    when prefix caching aligns chunks to it ("align").
    """
    return chunk_size + max_num_seqs - 1


def default_token_budget(chunk_size: int, max_num_seqs: int) -> int:
    """The derived budget: a power of two (a bucket size), at least 256 and the minimum above."""
    needed = max(DEFAULT_MIN_TOKEN_BUDGET, min_token_budget(chunk_size, max_num_seqs))
    return powers_of_two_up_to(needed)[-1]
