"""`quant_method: "compressed-tensors"` with format `float-quantized`: llm-compressor's FP8
checkpoints (its `FP8`, `FP8_DYNAMIC` and `FP8_BLOCK` schemes).

Each config group names its `targets` (["Linear"]) and the quantization of their `weights`
(8-bit float, symmetric, `strategy` "tensor": one `weight_scale` [1], "channel": [out, 1], or
"block": one per `block_structure` tile) and `input_activations` (dynamic per token, or static per
tensor with an `input_scale` each, or none: weight-only); `ignore` lists the modules kept
unquantized (names, or `re:` regexes); `kv_cache_scheme` adds the attention layers' `k_scale` /
`v_scale`. Groups that quantize differently, integer types, asymmetric scales, group strategies
and the other formats are refused by name.
"""

from __future__ import annotations

from typing import Any

from jmamba.checkpoints.quantization.config_fields import (
    QuantConfig,
    block_size,
    field,
    mapping,
    names,
    one_of,
)
from jmamba.checkpoints.quantization.scheme import Fp8Scheme

WHERE = "quantization_config"
FORMAT = "float-quantized"
_BLOCKS = {"tensor": (0, 0), "channel": (1, 0)}  # "block": from block_structure


def compressed_tensors_scheme(config: QuantConfig) -> Fp8Scheme:
    """The scheme of a compressed-tensors config; ValueError on a form we do not read."""
    one_of(config, "format", WHERE, {FORMAT}, FORMAT)
    groups = mapping(config, "config_groups", WHERE)
    if not groups:
        raise ValueError(f"{WHERE}.config_groups is empty: no quantized modules")
    forms = {_group_form(group, f"{WHERE}.config_groups.{key}") for key, group in groups.items()}
    if len(forms) > 1:
        raise ValueError(
            f"{WHERE}.config_groups quantize in {len(forms)} different ways {sorted(forms)}; "
            "one FP8 form per checkpoint is supported"
        )
    ((block, activations),) = forms
    return Fp8Scheme(
        "compressed-tensors",
        block,
        "weight_scale",
        static_inputs=activations == "static per tensor",
        kv_cache_scales=config.get("kv_cache_scheme") is not None,
        kept=names(config, "ignore", WHERE),
        activations=activations,
    )


def _group_form(group: Any, where: str) -> tuple[tuple[int, int], str]:
    """(block, activations) of one config group."""
    if not isinstance(group, dict):
        raise ValueError(f"{where}={group!r} must be an object")
    one_of(group, "format", where, {FORMAT}, FORMAT)
    if group.get("output_activations") is not None:
        raise ValueError(f"{where}.output_activations is set: output quantization is not supported")
    block = _weights_block(mapping(group, "weights", where), f"{where}.weights")
    return block, _activations(group.get("input_activations"), f"{where}.input_activations")


def _float8(args: QuantConfig, where: str) -> None:
    """ValueError unless `args` describe symmetric 8-bit floats."""
    one_of(args, "type", where, {"float"}, None)
    one_of(args, "num_bits", where, {8}, None)
    one_of(args, "symmetric", where, {True}, True)


def _weights_block(weights: QuantConfig, where: str) -> tuple[int, int]:
    _float8(weights, where)
    one_of(weights, "dynamic", where, {False}, False)
    strategy = one_of(weights, "strategy", where, {*_BLOCKS, "block"}, "tensor")
    if strategy == "block":
        return block_size(field(weights, "block_structure"), f"{where}.block_structure")
    return _BLOCKS[strategy]


def _activations(args: Any, where: str) -> str:
    if args is None:
        return "none (weight-only)"
    if not isinstance(args, dict):
        raise ValueError(f"{where}={args!r} must be an object or null")
    _float8(args, where)
    if field(args, "dynamic", False) is True:
        strategy = one_of(args, "strategy", where, {"token", "tensor", "group"}, "token")
        return f"dynamic per {strategy}"
    one_of(args, "strategy", where, {"tensor"}, "tensor")
    return "static per tensor"
