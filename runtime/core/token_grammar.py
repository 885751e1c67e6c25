"""`TokenGrammar`: what the builder asks of a request's grammar matcher (the contract between
`runtime.core` and `runtime.structured`, here so requests, schedules and the bitmask can name it
without importing each other)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

import numpy as np


class TokenGrammar(Protocol):
    """What the builder asks of a request's grammar matcher."""

    def fill(
        self,
        bitmask: np.ndarray,
        row: int,
        output_token_ids: Sequence[int],
        drafts: Sequence[int] = (),
    ) -> None:
        """Write rows `row` .. `row + len(drafts)`: the tokens allowed after the outputs, then
        after each draft in turn."""
        ...
