"""`Source`: how one parameter of `HybridLM` is built from checkpoint tensors and split back into
them (the loader builds, the writer splits; `jmamba.checkpoints.name_map` holds one per parameter,
`jmamba.checkpoints.folding` wraps them with folded constants), and the constructors of the common
kinds: a tensor as it is, a linear weight, conv taps, a stack of experts, fused halves."""

from __future__ import annotations

from collections.abc import Callable, Hashable
from typing import NamedTuple

import numpy as np

Path_ = tuple[str | int, ...]  # a parameter's path in the model's flat state


def param_path(parts: tuple[Hashable, ...]) -> Path_:
    """A path of `nnx.to_flat_state` as a `Path_`: nnx types its parts as any sortable keys, and a
    module's are its attribute names and list indices (TypeError on any other part)."""
    path: list[str | int] = []
    for part in parts:
        if not isinstance(part, str | int):
            raise TypeError(f"parameter path {parts} holds {part!r}, neither a name nor an index")
        path.append(part)
    return tuple(path)


class Source(NamedTuple):
    """The HF tensors of one parameter: `build(*tensors)` is the parameter and `split(param)`
    gives the tensors back, in the order of `names`. `piece` = (axis, index) when the tensors hold
    this parameter as piece `index` along `axis` beside other parameters' pieces (Granite's fused
    gate | up): `split` gives the piece and the writer concatenates the pieces in index order.
    `joint` lists other parameters whose values `split` needs after this one's,
    `split(param, *joint values)` (a Zamba2 shared kernel: every use site's folded copy and
    adapter).

    `read_axis` says how a slice of the parameter is read from slices of its tensors (a loader
    that reads each tensor-parallel shard's slice alone, `jmamba.checkpoints.shards`):
    `read_axis(a)` is the axis of the tensor that the parameter's axis `a` comes from, or None
    for the axis that picks one tensor of a stack (experts); `build` of the sliced tensors is
    then the sliced parameter (a transpose, a dropped unit axis, an elementwise map, a scalar
    fold all commute with slicing). None: the parameter must be built from whole tensors
    (a concatenation or interleaving of tensors, a per-column fold, a fused gate | up).

    `weight`: the one linear weight [out, in] whose transpose the parameter is, unchanged (no
    fold, no concatenation); what an FP8 load may keep in e4m3 (`jmamba.fp8_plan`). None for a
    parameter built otherwise.
    """

    names: tuple[str, ...]
    build: Callable[..., np.ndarray]
    split: Callable[..., tuple[np.ndarray, ...]]
    piece: tuple[int, int] | None = None
    joint: tuple[Path_, ...] = ()
    read_axis: Callable[[int], int | None] | None = None
    weight: str | None = None


def same_axis(axis: int) -> int:
    """`Source.read_axis` of a parameter laid out as its tensor."""
    return axis


def swapped_axis(axis: int) -> int:
    """`Source.read_axis` of a transposed 2-D tensor ([out, in] on disk, ours [in, out])."""
    return 1 - axis


def same(name: str) -> Source:
    """The tensor `name` as it is."""
    return Source((name,), lambda t: t, lambda p: (p,), read_axis=same_axis)


def linear(name: str) -> Source:
    """A linear layer's `name.weight`, [out, in] on disk, ours [in, out]."""
    weight = f"{name}.weight"
    return Source((weight,), lambda t: t.T, lambda p: (p.T,), read_axis=swapped_axis, weight=weight)


def conv(name: str) -> Source:
    """Conv taps [C, 1, K] on disk, ours [C, K]."""
    build, split = lambda t: t[:, 0, :], lambda p: (p[:, None, :],)
    return Source((f"{name}.weight",), build, split, read_axis=(0, 2).__getitem__)


def experts(prefix: str, proj: str, num_experts: int) -> Source:
    """One [out, in] tensor per expert on disk, ours one [E, in, out] stack (axis 0 picks the
    tensor)."""
    names = tuple(f"{prefix}.experts.{e}.{proj}.weight" for e in range(num_experts))
    build = lambda *ts: np.stack([t.T for t in ts])  # noqa: E731
    split = lambda p: tuple(e.T for e in p)  # noqa: E731
    return Source(names, build, split, read_axis=(None, 1, 0).__getitem__)


def swapped(name: str) -> Source:
    """A stack of linear weights [..., out, in] (Granite's experts), ours [..., in, out]."""
    swap = lambda t: np.swapaxes(t, -1, -2)  # noqa: E731
    return Source((f"{name}.weight",), swap, lambda p: (swap(p),))


def half(name: str, index: int) -> Source:
    """Half `index` (0: gate, 1: up) of a fused [gate | up] projection: Granite's `input_linear`,
    [2I, H] (or [E, 2I, H] for the experts), whose first I output rows are the gate's."""
    swap = lambda t: np.swapaxes(t, -1, -2)  # noqa: E731
    build = lambda t: swap(np.split(t, 2, axis=-2)[index])  # noqa: E731
    return Source((f"{name}.weight",), build, lambda p: (swap(p),), piece=(-2, index))
