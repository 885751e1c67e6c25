"""What the loader folds into a checkpoint's weights, and its inverse for the writer: constant
multipliers (`ModelConfig.multipliers`, Falcon-H1's muP ones; with the per-column multipliers of
the packed Mamba2 in_proj) and Zamba2's LoRA adapters.

A linear map's output times a constant is the same map with its kernel's output columns times that
constant, and a map plus a low-rank one is the map of the summed kernels, so the model holds the
folded kernels and its steps never see the multipliers or the adapters.
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np

from jmamba.checkpoints.source import Source
from jmamba.config import ModelConfig


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
    m, mult = cfg.need_mamba2(), cfg.multipliers
    gn = m.n_groups * m.d_state
    sizes = (m.d_inner, m.d_inner, gn, gn, m.num_heads)
    segments = np.asarray(mult.mamba2_segments, np.float64) * mult.mamba2_in
    return np.repeat(segments, sizes).astype(np.float32)


def scaled(source: Source, scale: float | np.ndarray) -> Source:
    """`source` with its parameter multiplied by `scale`, a scalar or one per output column of an
    [in, out] kernel; `source` itself where every multiplier is 1. A per-column scale makes the
    parameter one that a sliced read builds from whole tensors (`Source.read_axis`)."""
    scale = np.asarray(scale, np.float32)
    if np.all(scale == 1.0):
        return source
    return source._replace(
        build=lambda *ts: fold(source.build(*ts), scale),
        split=lambda p: source.split(unfold(p, scale)),
        # A scalar folds into any slice; a per-column one only into the whole parameter.
        read_axis=source.read_axis if scale.ndim == 0 else None,
        weight=None,  # the parameter is no longer the weight itself
    )


# Zamba2's LoRA adapters, folded into each use site's copy of a shared kernel
# (`jmamba.mixers.transformer_mamba2`).


def lora_product(down: np.ndarray, up: np.ndarray) -> np.ndarray:
    """`down @ up` ([in, r] @ [r, out]) in float64; contiguous operands, so the loader and the
    writer get the same bits from the same factors."""
    return np.ascontiguousarray(down, np.float64) @ np.ascontiguousarray(up, np.float64)


def lora_fold(kernel: np.ndarray, down: np.ndarray, up: np.ndarray) -> np.ndarray:
    """`kernel + down @ up` ([in, out]) in float64, rounded once to fp32."""
    return (np.asarray(kernel, np.float64) + lora_product(down, up)).astype(np.float32)


def _folded_as(kernel: np.ndarray, product: np.ndarray, dtype: np.dtype) -> np.ndarray:
    """What the loader makes of `kernel` and a site's product: fp32, then the parameter's dtype."""
    return (kernel.astype(np.float64) + product).astype(np.float32).astype(dtype)


def _half_spacing(param: np.ndarray) -> np.ndarray:
    """Half the distance from `param` to its neighbours in its dtype, as float64 (the larger side
    at a power of two: a guess the exact check in `lora_unfold` corrects)."""
    spare_bits = np.finfo(np.float32).nmant - jnp.finfo(param.dtype).nmant
    spacing = np.abs(np.spacing(param.astype(np.float32))).astype(np.float64)
    return spacing * 2.0**spare_bits / 2


def _bit_step(values: np.ndarray, step: int) -> np.ndarray:
    bits = np.dtype(f"u{values.dtype.itemsize}")
    return (values.view(bits).astype(np.int64) + step).astype(bits).view(values.dtype)


def lora_unfold(params: list[np.ndarray], products: list[np.ndarray]) -> np.ndarray:
    """The shared kernel W (in `params[0]`'s dtype) whose fold with every use site's adapter
    product gives that site's parameter: `_folded_as(W, products[j]) == params[j]` for every j
    where one exists (always, for parameters the loader folded from one W); elsewhere one that
    gives the first site's, or failing that (no W of the dtype may give it) the nearest to the
    first site's parameter minus its product. The candidates lie around the middle of the
    interval of reals each site allows (its parameter minus its product, +- half a step of the
    parameter's dtype)."""
    dtype = params[0].dtype
    low, high = np.full(params[0].shape, -np.inf), np.full(params[0].shape, np.inf)
    for param, product in zip(params, products, strict=True):
        centre, half = param.astype(np.float64) - product, _half_spacing(param)
        low, high = np.maximum(low, centre - half), np.minimum(high, centre + half)
    first = params[0].astype(np.float64) - products[0]
    guess = np.where(low <= high, (low + high) / 2, first).astype(dtype)
    fits_first = lambda w: _folded_as(w, products[0], dtype) == params[0]  # noqa: E731
    fits_all = lambda w: np.logical_and.reduce(  # noqa: E731
        [_folded_as(w, d, dtype) == p for p, d in zip(params, products, strict=True)]
    )
    out = guess
    for fits in (fits_first, fits_all):  # a fit for every site wins over one for the first
        for step in (2, -2, 1, -1, 0):  # the guess itself last: it wins over its neighbours
            candidate = _bit_step(guess, step)
            out = np.where(fits(candidate), candidate, out)
    return out
