"""Constant multipliers of a checkpoint folded into its weights at load time
(`ModelConfig.multipliers`, Falcon-H1's muP ones): the fold, its inverse for the writer, and the
per-column multipliers of the packed Mamba2 in_proj.

A linear map's output times a constant is the same map with its kernel's output columns times that
constant, so the model holds the folded kernels and its steps never see the multipliers.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from jmamba.config import ModelConfig

if TYPE_CHECKING:  # tensor_sources.py imports this module
    from jmamba.tensor_sources import Source


def fold(tensor: np.ndarray, scale: np.ndarray) -> np.ndarray:
    """`tensor * scale` in fp32, rounded once (the product of two fp32 values is exact in
    float64, so fp32 multiplication rounds it as float64 would)."""
    return np.asarray(tensor, np.float32) * scale


def unfold(param: np.ndarray, scale: np.ndarray) -> np.ndarray:
    """The tensor of `param`'s dtype that `fold` maps back to `param` (in that dtype), the nearest
    to `param / scale` of those within two steps of it (always one, for a `param` that `fold`
    made); otherwise the nearest, `param / scale`."""
    param = np.asarray(param)
    nearest = (param.astype(np.float32) / scale).astype(param.dtype)
    bits = np.dtype(f"u{param.dtype.itemsize}")
    out = nearest
    for step in (2, -2, 1, -1, 0):  # the nearest last: it wins over its neighbours
        candidate = (nearest.view(bits).astype(np.int64) + step).astype(bits).view(param.dtype)
        out = np.where(fold(candidate, scale).astype(param.dtype) == param, candidate, out)
    return out


def mamba2_in_proj_scale(cfg: ModelConfig) -> np.ndarray:
    """One multiplier per Mamba2 in_proj output column: the input's times its segment's (z, x, B,
    C or dt)."""
    m, mult = cfg.mamba2, cfg.multipliers
    gn = m.n_groups * m.d_state
    sizes = (m.d_inner, m.d_inner, gn, gn, m.num_heads)
    segments = np.asarray(mult.mamba2_segments, np.float64) * mult.mamba2_in
    return np.repeat(segments, sizes).astype(np.float32)


def scaled(source: Source, scale: float | np.ndarray) -> Source:
    """`source` with its parameter multiplied by `scale`, a scalar or one per output column of an
    [in, out] kernel; `source` itself where every multiplier is 1."""
    scale = np.asarray(scale, np.float32)
    if np.all(scale == 1.0):
        return source
    return source._replace(
        build=lambda *ts: fold(source.build(*ts), scale),
        split=lambda p: source.split(unfold(p, scale)),
    )
