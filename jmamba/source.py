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
    adapter)."""

    names: tuple[str, ...]
    build: Callable[..., np.ndarray]
    split: Callable[..., tuple[np.ndarray, ...]]
    piece: tuple[int, int] | None = None
    joint: tuple[Path_, ...] = ()
