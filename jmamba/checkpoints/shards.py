"""Read a checkpoint one tensor-parallel shard at a time: each shard's slice of each parameter is
read from the safetensors files as slices (`jmamba.checkpoints.reader`), so no tensor a shard splits
is ever read whole for it.

A parameter whose `ShardRule` splits it is, on shard t, the concatenation of runs of its whole value
along the rule's axis (`ShardRule.spans`); each run is read as the matching slice of its tensors
(`Source.read_axis`: the tensor axis of each parameter axis, or the tensors of a stack of experts)
and built as the whole loader builds it (`jmamba.checkpoints.weights.load_pretrained`), then cast to
the parameter's dtype. Transposes, dropped unit axes, elementwise maps and scalar folds commute with
slicing, so the shards are bit for bit those of the whole model sliced on the host
(`jmamba.sharding.shard_values`).

An FP8 checkpoint's dense projections come as e4m3 kernels and fp32 scales, each shard's slice
of both read as stored, where the shard model keeps them in FP8 (`with_checkpoint_quantization`,
`jmamba.parallel.fp8_shards`: the split keeps every scale block whole); its other FP8 weights
are read dequantized, as slices with the scales of their blocks (`jmamba.checkpoints.reader`).

Read whole and sliced after (what `Source.read_axis = None` marks): Qwen3-Next's interleaved
q|k|v|z and b|a projections and the other Gated DeltaNet in_proj concatenations (their slices cut
across tensors), Mamba2 in_proj with per-segment multipliers folded in (Falcon-H1: a per-column
scale), Granite's fused gate | up halves, Zamba2's shared blocks with their adapters. Parameters
every shard holds whole (norms, routers) are read whole once.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
from flax import nnx

from jmamba.checkpoints.families.registry import load_hf_config
from jmamba.checkpoints.name_map import tensor_sources
from jmamba.checkpoints.quantization.fp8_params import (
    checkpoint_sources,
    with_checkpoint_quantization,
)
from jmamba.checkpoints.reader import TensorReader
from jmamba.checkpoints.skipped_tensors import skipped_tensors
from jmamba.checkpoints.source import Path_, Source, param_path
from jmamba.checkpoints.weights import check_tensor_names, param_dtype, resolve_dtype
from jmamba.config import ModelConfig
from jmamba.model import HybridLM
from jmamba.parallel.rules import REPLICATED, ShardRule
from jmamba.sharding import param_rules, shard_config

ShardValues = Iterator[tuple[Path_, list[np.ndarray]]]


def read_shards(
    model_dir: str | Path,
    shards: int,
    dtype: str | np.dtype = "auto",
    *,
    reader: Callable[[Path], TensorReader] = TensorReader,
    with_head: bool = True,
) -> ShardValues:
    """For each parameter of the checkpoint's `HybridLM`, its path and its `shards` shard values
    in shard order (host arrays in the parameter's dtype, as `load_pretrained` casts them),
    read as slices where the parameter's source allows; without its MTP head unless
    `with_head` (`HybridLM.without_head`: the head's tensors are skipped). ValueError on missing
    or unexpected tensors, before any is read."""
    model_dir = Path(model_dir)
    cfg = with_checkpoint_quantization(load_hf_config(model_dir), model_dir)
    if not with_head:
        cfg = dataclasses.replace(cfg, mtp_mixers=(), mtp_ffns=())
    local = shard_config(cfg, shards)  # a clear error before anything is read
    dtype = resolve_dtype(dtype, model_dir)
    whole_cfg = dataclasses.replace(cfg, quantization=local.quantization)  # the shards' FP8
    whole = nnx.eval_shape(lambda: HybridLM(whole_cfg, rngs=nnx.Rngs(0)))
    rules = param_rules(cfg, shards) if shards > 1 else {}
    with reader(model_dir) as tensors:
        sources = _sources(whole_cfg, tensors)
        skipped = {
            n
            for names in skipped_tensors(
                cfg.architecture, tensors.names(), has_mtp=cfg.has_mtp
            ).values()
            for n in names
        }
        check_tensor_names(cfg, sources, tensors.names() - skipped, model_dir)
        for parts, variable in nnx.to_flat_state(nnx.state(whole)):
            path = param_path(parts)
            target = param_dtype(variable, dtype)
            shape = variable.get_value().shape
            rule = rules.get(path, REPLICATED)
            yield path, _shard_values(tensors, sources[path], rule, shape, shards, target)


def _sources(cfg: ModelConfig, tensors: TensorReader) -> dict[Path_, Source]:
    """The name map's sources, the FP8 layers of `cfg`'s plan read as stored (`tensors`
    told so: `TensorReader.keep_stored`) into their e4m3 kernels and scales."""
    sources = tensor_sources(cfg)
    plan = cfg.quantization
    weights = {sources[(*layer, "kernel")].weight for layer, _ in plan.layers}
    tensors.keep_stored({w for w in weights if w is not None})
    planned = checkpoint_sources(plan, sources, tensors.quantized, tensors.stored_shapes)
    return sources | planned


def _shard_values(
    tensors: TensorReader,
    source: Source,
    rule: ShardRule,
    shape: tuple[int, ...],
    shards: int,
    dtype: np.dtype,
) -> list[np.ndarray]:
    """Every shard's value of one parameter of whole shape `shape`."""
    if rule.segments and source.read_axis is not None:
        return [_read_shard(tensors, source, rule, shape, t, shards, dtype) for t in range(shards)]
    value = _cast(source.build(*(tensors.read(name) for name in source.names)), dtype, shape)
    return [rule.take(value, t, shards) for t in range(shards)]


def _read_shard(
    tensors: TensorReader,
    source: Source,
    rule: ShardRule,
    shape: tuple[int, ...],
    shard: int,
    shards: int,
    dtype: np.dtype,
) -> np.ndarray:
    """Shard `shard`'s value: its runs along the rule's axis, each read as a slice, then the
    zeros of a padded tail."""
    pieces = []
    for start, stop, pad in rule.spans(shard, shards):
        if stop > start:
            pieces.append(_read_run(tensors, source, shape, rule.axis, start, stop, dtype))
        if pad:
            padded = list(shape)
            padded[rule.axis] = pad
            pieces.append(np.zeros(padded, dtype))
    return np.concatenate(pieces, axis=rule.axis)


def _read_run(
    tensors: TensorReader,
    source: Source,
    shape: tuple[int, ...],
    axis: int,
    start: int,
    stop: int,
    dtype: np.dtype,
) -> np.ndarray:
    """Entries [start, stop) along parameter axis `axis`, built from slices of the tensors."""
    assert source.read_axis is not None, "only a source with a read_axis is read as slices"
    tensor_axis = source.read_axis(axis)
    if tensor_axis is None:  # the axis picks tensors of a stack: read those alone
        value = source.build(*(tensors.read(name) for name in source.names[start:stop]))
    else:
        name = source.names[0]
        index = [slice(0, n) for n in tensors.shape(name)]
        index[tensor_axis] = slice(start, stop)
        value = source.build(tensors.read(name, tuple(index)))
    run = list(shape)
    run[axis] = stop - start
    return _cast(value, dtype, tuple(run))


def _cast(value: np.ndarray, dtype: np.dtype, shape: tuple[int, ...]) -> np.ndarray:
    """`value` in `dtype`; ValueError unless it has `shape`."""
    value = np.asarray(value)
    if value.shape != shape:
        raise ValueError(f"tensors give shape {value.shape} where {shape} is expected")
    return np.asarray(value, dtype=dtype)
