"""Reading the fields of a `quantization_config` with errors that name the field, what it holds
and what is allowed (shared by the format parsers)."""

from __future__ import annotations

from collections.abc import Collection
from typing import Any

QuantConfig = dict[str, Any]


def field(config: QuantConfig, key: str, default: Any = None) -> Any:
    """`config[key]`, or `default` when absent or null."""
    value = config.get(key)
    return default if value is None else value


def one_of(
    config: QuantConfig, key: str, where: str, allowed: Collection[Any], default: Any
) -> Any:
    """`config[key]` (or `default`), which must be one of `allowed`."""
    value = field(config, key, default)
    if value not in allowed:
        raise ValueError(
            f"{where}.{key}={value!r} is not supported; expected one of {sorted(allowed, key=str)}"
        )
    return value


def names(config: QuantConfig, key: str, where: str) -> tuple[str, ...]:
    """`config[key]` as a tuple of module names or patterns (absent: none)."""
    value = field(config, key, [])
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise ValueError(f"{where}.{key}={value!r} must be a list of module names")
    return tuple(value)


def mapping(config: QuantConfig, key: str, where: str) -> QuantConfig:
    """`config[key]`, which must be a JSON object."""
    value = config.get(key)
    if not isinstance(value, dict):
        raise ValueError(f"{where}.{key}={value!r} must be an object")
    return value


def block_size(value: Any, where: str) -> tuple[int, int]:
    """A [rows, cols] block size of two positive ints."""
    if (
        not isinstance(value, list)
        or len(value) != 2
        or not all(isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in value)
    ):
        raise ValueError(f"{where}={value!r} must be [rows, cols], two positive ints")
    return value[0], value[1]
