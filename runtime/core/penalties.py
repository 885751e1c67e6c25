"""Presence / frequency / repetition penalties on the host: each penalized request's token history
and the step's `PenaltyInputs` tables built from it (numpy, no jax).

A request with penalties keeps a `PenaltyHistory`: its prompt's distinct ids, listed once when it
is created, then every output token as it appears (a new id gets a column, a known one a count).
The scheduler appends outputs to `Request.output_token_ids` as before; the history catches up when
read (`caught_up`), so each output is counted once, and a step copies the request's columns into
its row with one slice per table. A request without penalties has no history and costs nothing.

What the host cannot count is a token still on the device: an asynchronous engine feeds a decode
row the token the previous step sampled before the host sees it. Such a row is marked `pending`
and the sampler counts the token the row was actually fed as one more output
(runtime/device/sampler.py).
"""

from __future__ import annotations

import numpy as np

from runtime.core.sampling_inputs import PenaltyInputs, penalty_width
from runtime.core.sampling_params import SamplingParams

PenaltyRow = tuple[int, "PenaltyHistory", bool]  # (logits row, its history, fed token pending)


class PenaltyHistory:
    """One penalized request's distinct prompt and output tokens, with their output counts.

    Attributes:
      values: (presence, frequency, repetition) penalties of the request.
      num_prompt_ids: the first columns, the prompt's distinct ids.
      num_columns: distinct ids listed (prompt first, then new output ids in order of appearance).
    """

    def __init__(self, prompt_token_ids: list[int], params: SamplingParams) -> None:
        self.values = (params.presence_penalty, params.frequency_penalty, params.repetition_penalty)
        self._columns = dict.fromkeys(prompt_token_ids)  # id -> column, in order of appearance
        for column, token in enumerate(self._columns):
            self._columns[token] = column
        self.num_prompt_ids = self.num_columns = len(self._columns)
        capacity = max(2 * self.num_columns, 16)
        self._ids = np.zeros(capacity, np.int32)
        self._ids[: self.num_columns] = list(self._columns)
        self._counts = np.zeros(capacity, np.int32)
        self._num_counted = 0  # outputs counted so far

    def caught_up(self, output_token_ids: list[int]) -> PenaltyHistory:
        """Count the outputs appended since the last call (outputs only ever grow); returns self."""
        for token in output_token_ids[self._num_counted :]:
            column = self._columns.get(token)
            if column is None:
                column = self._columns[token] = self._new_column(token)
            self._counts[column] += 1
        self._num_counted = len(output_token_ids)
        return self

    def _new_column(self, token: int) -> int:
        """The next free column, for `token` (the arrays double when full)."""
        if self.num_columns == self._ids.size:
            self._ids = np.concatenate([self._ids, np.zeros_like(self._ids)])
            self._counts = np.concatenate([self._counts, np.zeros_like(self._counts)])
        column = self.num_columns
        self._ids[column] = token
        self.num_columns += 1
        return column

    @property
    def token_ids(self) -> np.ndarray:
        """[num_columns] int32 the distinct ids (a view: copy it before the next catch-up)."""
        return self._ids[: self.num_columns]

    @property
    def output_counts(self) -> np.ndarray:
        """[num_columns] int32 how many counted outputs each id is (a view, like `token_ids`)."""
        return self._counts[: self.num_columns]


def penalty_inputs(rows: list[PenaltyRow], num_rows: int) -> PenaltyInputs | None:
    """The step's penalty tables for `num_rows` logits rows, of which `rows` are penalized (each
    history caught up already); None when none is (the step's mode then has no penalties)."""
    if not rows:
        return None
    tables = neutral_penalties(num_rows, penalty_width(max(h.num_columns for _, h, _ in rows)))
    for row, history, pending in rows:
        n = history.num_columns
        tables.token_ids[row, :n] = history.token_ids
        tables.output_counts[row, :n] = history.output_counts
        tables.in_prompt[row, : history.num_prompt_ids] = True
        tables.presence[row], tables.frequency[row], tables.repetition[row] = history.values
        tables.pending[row] = pending
    return tables


def neutral_penalties(num_rows: int, width: int) -> PenaltyInputs:
    """Tables of `num_rows` rows x `width` columns that penalize nothing: no tokens, presence and
    frequency 0, repetition 1 (padding rows, and rows of requests without penalties)."""
    return PenaltyInputs(
        np.zeros((num_rows, width), np.int32),
        np.zeros((num_rows, width), np.int32),
        np.zeros((num_rows, width), bool),
        np.zeros(num_rows, np.float32),
        np.zeros(num_rows, np.float32),
        np.ones(num_rows, np.float32),
        np.zeros(num_rows, bool),
    )


def widened_penalties(
    penalties: PenaltyInputs | None, num_rows: int, width: int
) -> PenaltyInputs | None:
    """`penalties` with `width` columns (the width data-parallel ranks agreed on): padding
    columns added; neutral tables when this rank has no penalized row; None for width 0."""
    if width == 0:
        return None
    if penalties is None:
        return neutral_penalties(num_rows, width)
    extra = ((0, 0), (0, width - penalties.token_ids.shape[1]))
    return penalties._replace(
        token_ids=np.pad(penalties.token_ids, extra),
        output_counts=np.pad(penalties.output_counts, extra),
        in_prompt=np.pad(penalties.in_prompt, extra),
    )


def check_penalties(penalties: PenaltyInputs, sources: np.ndarray, vocab_size: int) -> None:
    """ValueError unless the tables list tokens of the vocabulary and only rows fed from the
    previous step (`sources` [N]: each logits row's token source, NULL: from the host) count a
    pending output."""
    ids = penalties.token_ids
    if ((ids < 0) | (ids >= vocab_size)).any():
        raise ValueError(f"penalty tables list token ids outside [0, {vocab_size})")
    wrong = np.flatnonzero(penalties.pending & (sources == 0))
    if wrong.size:
        raise ValueError(
            f"logits rows {wrong.tolist()} count a pending output, but their tokens come from "
            "the host (token source NULL)"
        )
