"""`QuantizedTensors`: which tensors of a checkpoint are FP8 weights, the scales each reads, and
the tensors the scheme consumes (scales, activation scales, KV-cache scales), found from the names,
dtypes and shapes alone, before any tensor is read.

The dtype on disk says what is quantized: a float8_e4m3fn linear weight `<linear>.weight` [out,
in], or a stack of experts [E, out, in] (packed `<p>.experts.gate_up_proj` / `down_proj`,
Granite's `block_sparse_moe.input_linear` / `output_linear`); any other tensor stays as it is
(the layers a checkpoint keeps in bf16). Refused, by name: an FP8 tensor in a checkpoint without
a `quantization_config`, an e5m2 one, an FP8 tensor of another kind or rank (a conv, a norm), a
missing scale or activation scale, and a scale whose shape is not one per block of its weight. A
scale whose weight is not FP8 (or KV-cache scales the config does not declare) is left among the
tensors, so the loader's name check calls it unexpected.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping

import ml_dtypes
import numpy as np

from jmamba.checkpoints.files import FLOAT8
from jmamba.checkpoints.quantization.dequantization import (
    check_scale_shape,
    dequantize,
    scale_grid,
    whole,
)
from jmamba.checkpoints.quantization.kv_scales import KV_SCALE_ENDINGS
from jmamba.checkpoints.quantization.scheme import Fp8Scheme
from jmamba.checkpoints.skipped_tensors import PACKED_EXPERTS

E4M3 = np.dtype(ml_dtypes.float8_e4m3fn)
# Stacks of expert weights [E, out, in]: packed experts, Granite's stacked ones.
EXPERT_STACKS = re.compile(
    rf"{PACKED_EXPERTS.pattern}|.+\.block_sparse_moe\.(input|output)_linear\.weight"
)


@dataclasses.dataclass(frozen=True)
class QuantizedTensors:
    """The FP8 weights of a checkpoint under `scheme`: `scales` maps each to its scale tensor,
    `consumed` holds every tensor the scheme reads beside the weights (they are no parameter's)."""

    scheme: Fp8Scheme
    scales: Mapping[str, str]
    consumed: frozenset[str]


def find_quantized(
    scheme: Fp8Scheme,
    shapes: Mapping[str, tuple[int, ...]],
    float8: Mapping[str, np.dtype],
) -> QuantizedTensors:
    """The FP8 weights among a checkpoint's tensors (`shapes`: every tensor's, `float8`: the
    dtype of each float8 one); ValueError on what we do not read (see the module docstring)."""
    if float8 and not scheme.quantized:
        first = sorted(float8)[0]
        raise ValueError(
            f"checkpoint holds {len(float8)} float8 tensor(s) ({first}, ...) but its config.json "
            "has no quantization_config"
        )
    scales: dict[str, str] = {}
    consumed: set[str] = set()
    for name, dtype in sorted(float8.items()):
        _check_weight(name, dtype, shapes[name])
        scale = scheme.scale_name(name)
        if scale not in shapes:
            raise ValueError(f"FP8 weight {name} has no scale tensor {scale} ({scheme.method})")
        check_scale_shape(shapes[scale], scale, shapes[name], scheme.block)
        scales[name] = scale
        consumed.add(scale)
        if scheme.static_inputs:
            consumed.add(_input_scale(scheme, name, shapes))
    if scheme.kv_cache_scales:
        consumed.update(n for n in shapes if n.endswith(KV_SCALE_ENDINGS))
    return QuantizedTensors(scheme, scales, frozenset(consumed))


def _check_weight(name: str, dtype: np.dtype, shape: tuple[int, ...]) -> None:
    """ValueError unless `name` is an e4m3 linear weight or stack of expert weights."""
    if dtype != E4M3:
        raise ValueError(f"tensor {name} is {dtype}: FP8 weights are read in float8_e4m3fn only")
    stack = EXPERT_STACKS.fullmatch(name) is not None
    linear = name.endswith(".weight") and len(shape) == 2
    if not (linear or (stack and len(shape) == 3)):
        raise ValueError(
            f"FP8 tensor {name} of shape {list(shape)} is not a layer kind we read quantized: "
            "linear weights [out, in] and stacks of expert weights [E, out, in] only"
        )


def _input_scale(scheme: Fp8Scheme, name: str, shapes: Mapping[str, tuple[int, ...]]) -> str:
    scale = scheme.input_scale_name(name)
    if scale not in shapes:
        raise ValueError(
            f"FP8 weight {name} has no activation scale {scale} ({scheme.method}, "
            f"{scheme.activations} activations)"
        )
    return scale


def float8_dtypes(tensors: Mapping[str, np.ndarray]) -> dict[str, np.dtype]:
    """The dtype of each float8 array among `tensors`."""
    return {n: t.dtype for n, t in tensors.items() if t.dtype in FLOAT8.values()}


def dequantized(scheme: Fp8Scheme, tensors: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """`tensors` with each FP8 weight in fp32 (dequantized) and the tensors the scheme consumes
    left out; ValueError as `find_quantized`."""
    shapes = {n: tuple(t.shape) for n, t in tensors.items()}
    found = find_quantized(scheme, shapes, float8_dtypes(tensors))
    out = {n: t for n, t in tensors.items() if n not in found.consumed}
    for name, scale in found.scales.items():
        grid = scale_grid(tensors[scale], shapes[name], scheme.block)
        out[name] = dequantize(tensors[name], grid, scheme.block, whole(shapes[name]))
    return out
