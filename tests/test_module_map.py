"""docs/architecture.md section 3 is the module map: every package and module it names exists,
and every package of the tree (a folder with an `__init__.py`, tests apart) is named in it."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).parents[1]
NAMES_WIDTH = 25  # the map's first column: names; descriptions start after it
INDENT = 2


def map_block() -> str:
    text = (ROOT / "docs" / "architecture.md").read_text()
    section = text.split("## 3. Layout", 1)[1].split("\n## ", 1)[0]
    return re.search(r"^```\n(.*?)^```", section, flags=re.MULTILINE | re.DOTALL).group(1)


def named_paths() -> set[str]:
    """Every folder and file the map names, as a path from the repository root."""
    paths, folders = set(), []  # folders: the open folder at each depth
    for line in map_block().splitlines():
        names = line[:NAMES_WIDTH]
        if not names.strip():
            continue  # a description's continuation
        depth = (len(names) - len(names.lstrip())) // INDENT
        folders = folders[:depth]
        for name in names.split():
            path = "/".join([*folders, name.rstrip("/")])
            paths.add(path)
            if name.endswith("/"):
                folders.append(name.rstrip("/"))
    return paths


def packages() -> set[str]:
    found = {p.parent.relative_to(ROOT).as_posix() for p in ROOT.glob("*/**/__init__.py")}
    return {p for p in found if not p.startswith(("tests", ".")) and "/." not in p}


def test_every_named_path_exists():
    missing = sorted(p for p in named_paths() if not (ROOT / p).exists())
    assert not missing, f"the module map names what the tree does not hold: {missing}"


def test_every_package_is_named():
    unnamed = sorted(packages() - named_paths())
    assert not unnamed, f"packages missing from docs/architecture.md section 3: {unnamed}"


def test_the_map_names_the_wings():
    assert {"jmamba/checkpoints/families", "runtime/core", "pallas_kernels/ssd"} <= named_paths()
