"""The tree passes the code checks the project keeps: ruff's lint rules and format, and mypy
(settings in pyproject.toml: strict on runtime/core/ and jmamba/step/, default elsewhere). The
versions are pinned in the `test` extra, so a new release cannot turn CI red on its own."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[1]
BIN = Path(sys.executable).parent


def run(*command: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(BIN / command[0]), *command[1:]],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )


@pytest.mark.parametrize(
    "command",
    [("ruff", "check", "."), ("ruff", "format", "--check", ".")],
    ids=["ruff-check", "ruff-format"],
)
def test_ruff_passes(command: tuple[str, ...]):
    done = run(*command)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]


def test_mypy_passes():
    done = run("mypy", "--no-incremental")
    assert done.returncode == 0, done.stdout[-6000:] + done.stderr[-2000:]
