"""The benchmarks' smoke tests run whole scripts: every one is in the slow tier (tests/tiers.py)."""

from __future__ import annotations

import pytest

from tests.tiers import slow


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    here = config.rootpath / "tests" / "benchmarks"
    for item in items:
        if item.path.is_relative_to(here):
            item.add_marker(slow)
