"""`Source`: how one parameter of `HybridLM` is built from checkpoint tensors and split back into
them (the loader builds, the writer splits; `jmamba.tensor_sources` holds one per parameter,
`jmamba.folding` wraps them with folded constants)."""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import numpy as np

Path_ = tuple[str | int, ...]  # a parameter's path in the model's flat state


class Source(NamedTuple):
    """The HF tensors of one parameter: `build(*tensors)` is the parameter and `split(param)`
    gives the tensors back, in the order of `names`. `piece` = (axis, index) when the tensors hold
    this parameter as piece `index` along `axis` beside other parameters' pieces (Granite's fused
    gate | up): `split` gives the piece and the writer concatenates the pieces in index order.
    `joint` lists other parameters whose values `split` needs after this one's,
    `split(param, *joint values)` (a Zamba2 shared kernel: every use site's folded copy and
    adapter).

    `read_axis` says how a slice of the parameter is read from slices of its tensors (a loader
    that reads each tensor-parallel shard's slice alone, `jmamba.shard_loading`):
    `read_axis(a)` is the axis of the tensor that the parameter's axis `a` comes from, or None
    for the axis that picks one tensor of a stack (experts); `build` of the sliced tensors is
    then the sliced parameter (a transpose, a dropped unit axis, an elementwise map, a scalar
    fold all commute with slicing). None: the parameter must be built from whole tensors
    (a concatenation or interleaving of tensors, a per-column fold, a fused gate | up).
    """

    names: tuple[str, ...]
    build: Callable[..., np.ndarray]
    split: Callable[..., tuple[np.ndarray, ...]]
    piece: tuple[int, int] | None = None
    joint: tuple[Path_, ...] = ()
    read_axis: Callable[[int], int | None] | None = None
