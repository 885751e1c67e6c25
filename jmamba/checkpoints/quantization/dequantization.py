"""An FP8 weight's fp32 values: each e4m3 entry times the scale of its block.

A weight [..., out, in] (leading axes: packed experts) with blocks of (r, c) entries has a scale
grid [..., ceil(out / r), ceil(in / c)] (a block side of 0 spans its axis: grid size 1), the last
row and column of blocks cut short where r or c does not divide the weight: the layout vLLM and
the published checkpoints use. The product of an e4m3 value (exact in fp32) and an fp32 scale is
rounded once, so a slice of a weight dequantizes to the same bits as the whole weight's slice.
"""

from __future__ import annotations

import math

import numpy as np

Index = tuple[slice, ...]


def grid_shape(shape: tuple[int, ...], block: tuple[int, int]) -> tuple[int, ...]:
    """The scale grid of a weight of `shape` in blocks of `block`."""
    sides = (math.ceil(n / side) if side else 1 for n, side in zip(shape[-2:], block, strict=True))
    return (*shape[:-2], *sides)


def _squeezed(shape: tuple[int, ...]) -> tuple[int, ...]:
    return tuple(n for n in shape if n != 1)


def check_scale_shape(
    scale_shape: tuple[int, ...], name: str, shape: tuple[int, ...], block: tuple[int, int]
) -> None:
    """ValueError naming the scale tensor `name` unless it holds one scale per block of a weight
    of `shape` (unit axes aside: `[out]` and `[out, 1]` are both per-channel scales)."""
    grid = grid_shape(shape, block)
    if _squeezed(tuple(scale_shape)) != _squeezed(grid):
        sides = "x".join(str(side or "all") for side in block)
        raise ValueError(
            f"scale tensor {name} has shape {list(scale_shape)}, but {sides} blocks of its "
            f"weight's {list(shape)} need {list(grid)}"
        )


def scale_grid(scale: np.ndarray, shape: tuple[int, ...], block: tuple[int, int]) -> np.ndarray:
    """`scale` (checked by `check_scale_shape`) as an fp32 grid of `grid_shape(shape, block)`."""
    return np.asarray(scale, np.float32).reshape(grid_shape(shape, block))


def whole(shape: tuple[int, ...]) -> Index:
    """The index of a whole tensor of `shape`."""
    return tuple(slice(0, n) for n in shape)


def dequantize(
    entries: np.ndarray, grid: np.ndarray, block: tuple[int, int], index: Index
) -> np.ndarray:
    """The fp32 values of `entries`, the slice `index` (explicit starts and stops, steps of 1)
    of an e4m3 weight whose scale grid is `grid` (`scale_grid`)."""
    scales = grid[index[:-2]]
    for axis, part, side in zip((-2, -1), index[-2:], block, strict=True):
        positions = np.arange(part.start, part.stop)
        scales = np.take(scales, positions // side if side else positions * 0, axis=axis)
    return np.asarray(entries).astype(np.float32) * scales
