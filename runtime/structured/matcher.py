"""`GrammarMatcher`: one request's place in its grammar, and the bitmask rows it allows.

The matcher follows the request's outputs lazily: when the builder asks it for a row it first
consumes the outputs retired since (`fill`), so it never runs ahead of what the host knows. A
decode row with drafts (speculative decoding) gets one row per lane: lane t's is the grammar's
state after the row's first t drafts, consumed for the fill and rolled back after. A draft the
grammar refuses is not consumed: lane t's mask then excludes the draft lane t + 1 fed, so the
device rejects that draft whatever the logits (lossless), and the lanes after it, never used,
stay unconstrained.
"""

from __future__ import annotations

from collections.abc import Sequence

import llguidance
import llguidance.numpy
import numpy as np


class GrammarMatcher:
    """A request's llguidance matcher, caught up with its outputs on each `fill`.

    Attributes:
      num_consumed: the request's outputs consumed so far.
      error: llguidance's message once an output broke the grammar (never, when every token
        was sampled under its masks), else None; its rows then allow the EOS ids alone.
    """

    def __init__(
        self, matcher: llguidance.LLMatcher, vocab_size: int, eos_token_ids: tuple[int, ...]
    ) -> None:
        """`matcher`: a fresh copy of the request's compiled grammar; `vocab_size`: its
        tokenizer's (the width it masks); `eos_token_ids`: what ends the output."""
        self._matcher = matcher
        self._eos_token_ids = eos_token_ids
        self._scratch = llguidance.numpy.allocate_token_bitmask(1, vocab_size)
        self.num_consumed = 0
        self.error: str | None = None

    def fill(
        self,
        bitmask: np.ndarray,
        row: int,
        output_token_ids: Sequence[int],
        drafts: Sequence[int] = (),
    ) -> None:
        """Write rows `row` .. `row + len(drafts)` of `bitmask` [N, W] int32 (bit i of word w:
        token 32 w + i is allowed): the grammar after `output_token_ids`, then after each
        draft in turn (module docstring). Rows past a refused draft are left as they are."""
        self._catch_up(output_token_ids)
        consumed = 0
        for lane in range(len(drafts) + 1):
            self._fill_row(bitmask[row + lane])
            if lane == len(drafts) or not _allows(bitmask[row + lane], drafts[lane]):
                break
            self._matcher.consume_token(drafts[lane])
            consumed += 1
        if consumed:
            self._matcher.rollback(consumed)

    def _catch_up(self, output_token_ids: Sequence[int]) -> None:
        """Consume the outputs retired since the last fill."""
        new = output_token_ids[self.num_consumed :]
        if not new or self.error is not None:
            return
        self.num_consumed = len(output_token_ids)
        if not self._matcher.consume_tokens(list(new)):
            self.error = self._matcher.get_error()

    def _fill_row(self, row: np.ndarray) -> None:
        """One row: the grammar's next allowed tokens, cut or zero-padded to the row's width."""
        if self.error is not None:
            row[:] = packed_tokens(self._eos_token_ids, row.size)
            return
        llguidance.numpy.fill_next_token_bitmask(self._matcher, self._scratch, 0)
        width = min(row.size, self._scratch.shape[1])
        row[:width] = self._scratch[0, :width]
        row[width:] = 0


def packed_tokens(token_ids: Sequence[int], num_words: int) -> np.ndarray:
    """[num_words] int32, the bitmask row that allows `token_ids` alone."""
    bits = np.zeros(num_words * 32, np.uint8)
    bits[list(token_ids)] = 1
    return np.packbits(bits, bitorder="little").view(np.int32)


def _allows(row: np.ndarray, token: int) -> bool:
    """Whether bitmask row `row` allows `token`."""
    word = token >> 5
    return word < row.size and bool((int(row[word]) >> (token & 31)) & 1)
