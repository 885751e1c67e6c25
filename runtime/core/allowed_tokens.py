"""The allowed-token bitmask of a step (no jax): one packed int32 row per logits row.

Bit i of word w of a row allows token 32 w + i. Every row is all ones (-1: unconstrained)
unless its request follows a grammar (`SamplingParams.structured`), whose matcher
(`TokenGrammar`, a `runtime.structured.GrammarMatcher`) fills it. The bitmask is an input of
every step program, so a grammar row costs no program of its own; the sampler applies it on the
device (`runtime.device.sampler`).
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Protocol

import numpy as np

from runtime.core.schedule import RowSequence, StepSchedule
from runtime.core.token_grammar import TokenGrammar


class GrammarSequence(Protocol):
    """What `fill_grammar_rows` reads of a row's sequence (a `Request`)."""

    @property
    def grammar(self) -> TokenGrammar | None: ...

    @property
    def output_token_ids(self) -> list[int]: ...


# (first logits row, its sequence, the drafts its next lanes feed) of a row that follows a grammar
GrammarRow = tuple[int, GrammarSequence, Sequence[int]]


def bitmask_words(vocab_size: int) -> int:
    """W, the int32 words of a bitmask row over `vocab_size` tokens."""
    return -(-vocab_size // 32)


def allowed_bitmask(num_rows: int, vocab_size: int) -> np.ndarray | None:
    """[num_rows, W] int32 all ones (every token allowed), read-only; None when `vocab_size` is
    0 (inputs built without a model: no bitmask, the sampler masks nothing)."""
    if vocab_size == 0:
        return None
    return _all_ones(num_rows, bitmask_words(vocab_size))


@functools.lru_cache(maxsize=16)
def _all_ones(num_rows: int, num_words: int) -> np.ndarray:
    """One read-only all-ones bitmask per shape: a step without grammar rows packs it as it
    is (filling 256 rows of a 151,936-token vocabulary afresh cost 1.4 ms a step)."""
    ones = np.full((num_rows, num_words), -1, np.int32)
    ones.flags.writeable = False
    return ones


def with_grammar_rows(bitmask: np.ndarray | None, rows: list[GrammarRow]) -> np.ndarray | None:
    """`bitmask`, or with grammar rows a copy of it with each one's lanes filled by its
    matcher (`TokenGrammar.fill`)."""
    if not rows:
        return bitmask
    if bitmask is None:
        raise ValueError("a row follows a grammar: build the step with the model's vocab_size")
    filled = bitmask.copy()
    for row, sequence, drafts in rows:
        grammar = sequence.grammar
        if grammar is not None:
            grammar.fill(filled, row, sequence.output_token_ids, drafts)
    return filled


def grammar_rows[S: RowSequence](
    schedule: StepSchedule[S], width: int, num_decode_lanes: int
) -> list[GrammarRow]:
    """The rows of `schedule` that follow a grammar, as the builder lays them out (decode row i
    at logits row i * `width`, its drafts on the lanes after; prefill row j at
    `num_decode_lanes` + j), each prefill row only where its chunk samples a token.
    ValueError for a grammar row whose drafts are still on the device (the scheduler gives such
    rows none)."""
    rows: list[GrammarRow] = []
    for i, item in enumerate(schedule.decodes):
        if item.request.grammar is not None:
            if item.draft_sources:
                raise ValueError(f"{item.request!r} follows a grammar: its drafts must be known")
            rows.append((i * width, item.request, item.draft_token_ids[: item.num_tokens - 1]))
    for j, item in enumerate(schedule.prefills):
        request = item.request
        if request.grammar is not None and item.start + item.num_tokens >= request.num_tokens:
            rows.append((num_decode_lanes + j, request, ()))
    return rows
