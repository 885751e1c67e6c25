"""Hugging Face hub ids ("org/name") -> a checkpoint directory in huggingface_hub's cache.

`snapshot(repo_id)` downloads only the files jmamba reads (`ALLOW_PATTERNS`) with
`huggingface_hub.snapshot_download`, or finds them in the cache when offline (`HF_HUB_OFFLINE=1`)
or when the hub cannot be reached. huggingface_hub is an optional dependency
(`pip install 'jmamba[hub]'`). The cache directory is huggingface_hub's, read from the environment
when `snapshot` is called: `HF_HUB_CACHE`, else `$HF_HOME/hub`, else
`~/.cache/huggingface/hub` (`$XDG_CACHE_HOME/huggingface/hub` where that is set).
"""

from __future__ import annotations

import os
import re
from pathlib import Path

# What jmamba reads of a checkpoint: its configs, its tokenizer files and its weights. A
# multimodal repository's image processor and preprocessor configs, and any other weights
# format (*.bin, *.pth, *.gguf), are not fetched.
ALLOW_PATTERNS = [
    "config.json",
    "generation_config.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "chat_template.jinja",
    "special_tokens_map.json",
    "*.safetensors",
    "model.safetensors.index.json",
]
# An owner and a name, each of letters, digits, "_", "-" and "." (at most 96), starting and ending
# with a letter, digit or "_", without "--" or "..": huggingface_hub's `validate_repo_id` rules.
_PART = re.compile(r"[A-Za-z0-9_](?:[A-Za-z0-9_.-]{0,94}[A-Za-z0-9_])?")
_TRUE = {"1", "on", "yes", "true"}


def is_hub_id(name: str) -> bool:
    """Whether `name` has the form of a hub repository id: "org/name" (one slash)."""
    parts = name.split("/")
    return len(parts) == 2 and all(
        _PART.fullmatch(part) and "--" not in part and ".." not in part for part in parts
    )


def cache_dir() -> Path:
    """huggingface_hub's cache directory as the environment sets it now (see the module doc)."""
    cache = os.environ.get("HF_HUB_CACHE") or os.environ.get("HUGGINGFACE_HUB_CACHE")
    if not cache:
        xdg = os.environ.get("XDG_CACHE_HOME") or os.path.join("~", ".cache")
        home = os.environ.get("HF_HOME") or os.path.join(xdg, "huggingface")
        cache = os.path.join(home, "hub")
    return Path(os.path.expandvars(os.path.expanduser(cache)))


def offline() -> bool:
    """`HF_HUB_OFFLINE` (or transformers' `TRANSFORMERS_OFFLINE`) set to 1/on/yes/true."""
    value = os.environ.get("HF_HUB_OFFLINE") or os.environ.get("TRANSFORMERS_OFFLINE") or ""
    return value.strip().lower() in _TRUE


def _local_path_hint() -> str:
    return (
        "or pass a local checkpoint directory instead (--model /path/to/dir, LLM('/path/to/dir'))"
    )


def snapshot(repo_id: str) -> Path:
    """The local directory of hub repository `repo_id` (its "main" revision): downloaded into the
    cache (only `ALLOW_PATTERNS`), or, offline or without network, the cached snapshot. ValueError,
    naming the cache directory and the local-path alternative, when it cannot be had."""
    cache = cache_dir()
    try:
        from huggingface_hub import snapshot_download
        from huggingface_hub.errors import LocalEntryNotFoundError
    except ImportError:
        raise ValueError(
            f"model={repo_id!r} is a Hugging Face hub id, which needs the huggingface_hub "
            f"package (pip install 'jmamba[hub]'; its cache would be {cache}); "
            + _local_path_hint()
        ) from None
    is_offline = offline()
    try:
        path = snapshot_download(
            repo_id,
            cache_dir=cache,
            allow_patterns=ALLOW_PATTERNS,
            local_files_only=is_offline,
        )
    except LocalEntryNotFoundError as error:  # offline or unreachable, and not (whole) in cache
        why = "HF_HUB_OFFLINE is set" if is_offline else "the hub could not be reached"
        raise ValueError(
            f"model={repo_id!r}: {why} and the Hugging Face cache {cache} has no complete "
            f"snapshot of it ({type(error).__name__}); download it while online, "
            + _local_path_hint()
        ) from None
    except Exception as error:  # noqa: BLE001 - no such repository, gated, private, HTTP errors
        if not type(error).__module__.startswith("huggingface_hub"):
            raise
        raise ValueError(
            f"model={repo_id!r} could not be fetched from the Hugging Face hub into {cache}: "
            f"{type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}; "
            "check the id (and HF_TOKEN for a gated or private repository), " + _local_path_hint()
        ) from None
    return Path(path)
