"""Checks of user-supplied values: each returns the value normalised or raises a ValueError that
names the argument, its value and what is allowed (no jax; shared by every public entry point).

`bool` is rejected wherever an int or a number is asked for (`isinstance(True, int)` holds in
Python, so a plain isinstance test would let `seed=True` through). Numpy integer and floating
scalars are accepted and converted to Python ints and floats.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Sequence

import numpy as np


def _is_bool(value: object) -> bool:
    return isinstance(value, bool | np.bool_)


def integer(name: str, value: object, *, low: int | None = None, high: int | None = None) -> int:
    """`value` as an int in [low, high] (a missing bound is open); else ValueError."""
    number = None if _is_bool(value) or not isinstance(value, numbers.Integral) else int(value)
    if number is None or (low is not None and number < low) or (high is not None and number > high):
        raise ValueError(f"{name}={value!r} must be an int{_range(low, high, low_open=False)}")
    return number


def real(
    name: str, value: object, *, low: float, high: float | None = None, low_open: bool = False
) -> float:
    """`value` (int or float) as a finite float in [low, high], or (low, high] with `low_open`."""
    number = None if _is_bool(value) or not isinstance(value, numbers.Real) else float(value)
    if (
        number is None
        or not math.isfinite(number)
        or not (number > low if low_open else number >= low)
        or (high is not None and number > high)
    ):
        raise ValueError(f"{name}={value!r} must be a finite number{_range(low, high, low_open)}")
    return number


def _range(low: float | None, high: float | None, low_open: bool) -> str:
    if high is None:
        return "" if low is None else f" {'>' if low_open else '>='} {low}"
    return f" in {'(' if low_open else '['}{low}, {high}]"


def flag(name: str, value: object) -> bool:
    """`value` if it is a bool (numpy's included); 0, 1 or "yes" are refused, not guessed."""
    if not _is_bool(value):
        raise ValueError(f"{name}={value!r} must be True or False")
    return bool(value)


def choice(name: str, value: object, allowed: tuple[str, ...]) -> str:
    """`value` if it is one of the strings `allowed`; else ValueError naming them."""
    if not isinstance(value, str) or value not in allowed:
        raise ValueError(f"{name}={value!r} must be one of {allowed}")
    return value


def sizes(name: str, value: object, *, reaching: int) -> tuple[int, ...]:
    """A tuple or list of ints >= 1 as a sorted tuple without repeats whose largest is at least
    `reaching` (bucket sizes); else ValueError."""
    if isinstance(value, str) or not isinstance(value, tuple | list):
        raise ValueError(f"{name}={value!r} must be a tuple of ints")
    entries = tuple(sorted({integer(f"{name} entry", v, low=1) for v in value}))
    if not entries or entries[-1] < reaching:
        raise ValueError(f"{name}={entries} must be positive sizes reaching at least {reaching}")
    return entries


def token_ids(name: str, value: object, vocab_size: int | None = None) -> list[int]:
    """A flat sequence of int token ids (list, tuple or 1-D integer array) as a list of ints.

    Refused: strings (a string of digits is not a list of ids), nested lists, floats, bools and,
    with `vocab_size`, ids outside [0, vocab_size); without it, negative ids.
    """
    ids: list[int]
    if isinstance(value, np.ndarray):
        if value.ndim != 1 or not np.issubdtype(value.dtype, np.integer):
            raise ValueError(
                f"{name} must be a 1-D array of integer token ids, got dtype={value.dtype} "
                f"shape={value.shape}"
            )
        ids = value.tolist()
    elif isinstance(value, str | bytes) or not isinstance(value, Sequence):
        raise ValueError(f"{name} must be a list of int token ids, got {_short(value)}")
    else:
        bad = [
            (i, t)
            for i, t in enumerate(value)
            if _is_bool(t) or not isinstance(t, numbers.Integral)
        ]
        if bad:
            i, t = bad[0]
            raise ValueError(f"{name}[{i}]={_short(t)} is not an int token id ({len(bad)} bad)")
        ids = [int(t) for t in value]
    high = vocab_size if vocab_size is not None else float("inf")
    outside = [t for t in ids if not 0 <= t < high]
    if outside:
        allowed = f"the vocabulary [0, {vocab_size})" if vocab_size is not None else "ids >= 0"
        raise ValueError(f"{name} {outside[:8]} are outside {allowed}")
    return ids


def strings(name: str, value: object) -> tuple[str, ...]:
    """One non-empty str or a sequence of them, as a tuple (duplicates dropped, order kept)."""
    items = (value,) if isinstance(value, str) else value
    if isinstance(items, bytes) or not isinstance(items, Sequence):
        raise ValueError(f"{name} must be a str or a list of str, got {_short(value)}")
    bad = [s for s in items if not isinstance(s, str) or not s]
    if bad:
        raise ValueError(f"{name} entries must be non-empty strings, got {_short(bad[0])}")
    return tuple(dict.fromkeys(items))


def request_id(value: object) -> str:
    """Request ids are strings; an int (not a bool) is accepted and means `str(value)`."""
    if isinstance(value, str):
        return value
    if _is_bool(value) or not isinstance(value, numbers.Integral):
        raise ValueError(f"request_id={_short(value)} must be a str or an int")
    return str(int(value))


def _short(value: object) -> str:
    text = repr(value)
    return f"{type(value).__name__} {text if len(text) <= 40 else text[:37] + '...'}"
