"""A Hugging Face hub cache laid out as huggingface_hub lays it out, for tests without network:
`<cache>/models--<org>--<name>/blobs/<sha256>` holds each file once, `snapshots/<commit>/<file>`
links to its blob, and `refs/main` names the commit."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

COMMIT = "0123456789abcdef0123456789abcdef01234567"


def add_repo(cache: Path, repo_id: str, files: dict[str, Path], commit: str = COMMIT) -> Path:
    """Put `files` (name in the repository -> a file to copy) into `cache` as the snapshot of
    `repo_id`'s main branch at `commit`; returns the snapshot directory."""
    repo = cache / ("models--" + repo_id.replace("/", "--"))
    snapshot = repo / "snapshots" / commit
    (repo / "blobs").mkdir(parents=True, exist_ok=True)
    snapshot.mkdir(parents=True, exist_ok=True)
    for name, source in files.items():
        data = source.read_bytes()
        blob = repo / "blobs" / hashlib.sha256(data).hexdigest()
        blob.write_bytes(data)
        link = snapshot / name
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(os.path.relpath(blob, link.parent))
    (repo / "refs").mkdir(exist_ok=True)
    (repo / "refs" / "main").write_text(commit)
    return snapshot


def add_fixture(cache: Path, repo_id: str, fixture: Path) -> Path:
    """A fixture directory's checkpoint files (not its expected.npz) as `repo_id` in `cache`."""
    files = {p.name: p for p in sorted(fixture.iterdir()) if p.name != "expected.npz"}
    return add_repo(cache, repo_id, files)
