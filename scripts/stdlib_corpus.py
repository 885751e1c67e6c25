"""The training text of the `stdlib` preset: the Python standard library's own source.

Every machine with Python has it. The corpus is every `.py` file under the running interpreter's
`sysconfig` "stdlib" directory, sorted by relative path, minus third-party and test directories
(Linux distributions often ship the tests separately, so leaving them out keeps the corpus the same
on more machines). Files whose CRC-32 of the relative path is divisible by `HELDOUT_MODULUS` are
held out for evaluation. Bytes are token ids (see `jmamba.text.tokenizer`) and every file ends with
`<|endoftext|>`. `sha256` identifies the exact text, so a re-run can tell whether it trains on the
same corpus.
"""

from __future__ import annotations

import dataclasses
import hashlib
import sysconfig
import zlib
from pathlib import Path

import numpy as np

from jmamba.text.tokenizer import EOS_ID

EXCLUDED_DIRS = ("__pycache__", "dist-packages", "idle_test", "site-packages", "test", "tests")
HELDOUT_MODULUS = 50


@dataclasses.dataclass(frozen=True)
class Corpus:
    """Token ids of the training and held-out files, and what identifies them."""

    root: str
    train: np.ndarray
    heldout: np.ndarray
    train_files: tuple[str, ...]
    heldout_files: tuple[str, ...]
    sha256: str

    def record(self) -> dict:
        """What `training.json` keeps about the corpus."""
        return dict(
            root=self.root,
            excluded_dirs=list(EXCLUDED_DIRS),
            heldout_rule=f"crc32(relative path) % {HELDOUT_MODULUS} == 0",
            num_train_files=len(self.train_files),
            train_bytes=int(self.train.size),
            heldout_files=list(self.heldout_files),
            heldout_bytes=int(self.heldout.size),
            sha256=self.sha256,
        )


def stdlib_files(root: Path) -> list[str]:
    """Relative paths (posix) of the corpus files under `root`, sorted."""
    files = []
    for path in root.rglob("*.py"):
        relative = path.relative_to(root)
        if not set(relative.parts[:-1]) & set(EXCLUDED_DIRS) and path.is_file():
            files.append(relative.as_posix())
    return sorted(files)


def is_heldout(relative: str) -> bool:
    return zlib.crc32(relative.encode()) % HELDOUT_MODULUS == 0


def file_tokens(data: bytes) -> np.ndarray:
    """The ids of one document: its bytes, then `<|endoftext|>`."""
    return np.concatenate([np.frombuffer(data, np.uint8).astype(np.int32), [EOS_ID]])


def load_corpus(root: Path | None = None) -> Corpus:
    """Read the corpus of `root` (default: this interpreter's standard library)."""
    root = Path(root or sysconfig.get_paths()["stdlib"])
    digest = hashlib.sha256()
    parts: dict[bool, list[np.ndarray]] = {False: [], True: []}
    names: dict[bool, list[str]] = {False: [], True: []}
    for relative in stdlib_files(root):
        data = (root / relative).read_bytes()
        digest.update(relative.encode() + b"\0" + len(data).to_bytes(8, "little") + data)
        parts[is_heldout(relative)].append(file_tokens(data))
        names[is_heldout(relative)].append(relative)
    if not parts[False] or not parts[True]:
        raise ValueError(f"no .py files to train on (or none held out) under {root}")
    return Corpus(
        root=str(root),
        train=np.concatenate(parts[False]),
        heldout=np.concatenate(parts[True]),
        train_files=tuple(names[False]),
        heldout_files=tuple(names[True]),
        sha256=digest.hexdigest(),
    )
