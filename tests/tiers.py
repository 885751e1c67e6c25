"""The test tiers. `slow` marks the long matrices: every family past the first of an engine
matrix, the odd-shaped checkpoints' repeats, the README's server and command blocks, the
benchmark smoke tests and the two-process run. `pytest -m "not slow"` is the quick tier a
developer runs while working (minutes); `.ci/run` runs both tiers.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import pytest

slow = pytest.mark.slow


def quick_first(values: Iterable[Any]) -> list[Any]:
    """Parameter values for `parametrize` (or a fixture's `params`): the first in the quick tier,
    the others in the slow one. A tuple is one case of several argument names."""
    return [value if i == 0 else slow_case(value) for i, value in enumerate(values)]


def slow_cases(values: Iterable[Any], quick: Sequence[Any] = ()) -> list[Any]:
    """Parameter values all in the slow tier but those in `quick`."""
    return [value if value in quick else slow_case(value) for value in values]


def slow_case(value: Any) -> Any:
    """One parameter value (a tuple: one per argument name) in the slow tier."""
    return pytest.param(*(value if isinstance(value, tuple) else (value,)), marks=slow)
