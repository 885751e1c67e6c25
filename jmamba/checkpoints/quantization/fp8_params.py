"""FP8 weights kept in e4m3 at load: the model's `Fp8Plan` and the name map's `Source`s that build
each planned layer's kernel and scale, for `load_pretrained` (one whole model) and for the loader
that reads one tensor-parallel shard at a time (`with_checkpoint_quantization`,
`jmamba.checkpoints.shards`: its dense layers stay e4m3 where the split keeps their scale blocks
whole, `jmamba.parallel.fp8_shards`; its expert stacks are read dequantized).

A layer is planned when it is a dense `Linear` (not the LM head, which the model reads as a
matrix, nor an fp32 router) whose parameter is one checkpoint weight transposed and nothing else
(`Source.weight`): from an FP8 checkpoint, where that weight is FP8, in the checkpoint's scale
layout; under `quantization="fp8"` (`dynamic_fp8`), every such layer, per output channel (amax /
448, vLLM's `--quantization fp8`). The other FP8 weights are dequantized as before, each with its
reason in the plan: kernels with a multiplier or a LoRA adapter folded in, parameters
concatenated from several tensors, expert stacks fused in one tensor or cut by their scale blocks.
A MoE's FP8 expert stacks stay e4m3 (`jmamba.checkpoints.quantization.fp8_experts`). The plan
also carries the attention layers' KV-cache scales where the checkpoint declares them
(`kv_scales`).
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Mapping
from pathlib import Path

import ml_dtypes
import numpy as np
from flax import nnx

from jmamba.checkpoints.name_map import tensor_sources
from jmamba.checkpoints.quantization.dequantization import grid_shape
from jmamba.checkpoints.quantization.fp8_experts import (
    expert_plan,
    expert_scale_sources,
    expert_stacks,
    expert_tensors,
    fp8_weight_names,
)
from jmamba.checkpoints.quantization.kv_scales import kv_scales, read_kv_scales
from jmamba.checkpoints.quantization.quantized_tensors import (
    QuantizedTensors,
    dequantized,
    find_quantized,
    float8_dtypes,
)
from jmamba.checkpoints.quantization.registry import load_scheme
from jmamba.checkpoints.quantization.scheme import Fp8Scheme
from jmamba.checkpoints.reader import TensorReader
from jmamba.checkpoints.source import Source, param_path, swapped_axis
from jmamba.config import ModelConfig
from jmamba.fp8_plan import NO_FP8, Block, Fp8Plan, Path_
from jmamba.layers.fp8_experts import EXPERT_STACKS
from jmamba.layers.linear import Linear
from jmamba.model import HybridLM
from jmamba.parallel.fp8_shards import EXPERTS_REASON

Tensors = dict[str, np.ndarray]
Sources = dict[Path_, Source]
E4M3_MAX = 448.0
PER_CHANNEL: Block = (0, 1)  # ours [in, out]: one scale per output column
DYNAMIC = "fp8 (quantized at load) e4m3 weights per channel, dynamic per token activations"


def linear_layers(cfg: ModelConfig) -> list[Path_]:
    """The module paths of the dense `Linear`s of `HybridLM(cfg)` an FP8 plan may cover: every
    one with a plain `nnx.Param` kernel (an `Fp32Param` router stays fp32) but the LM head."""
    model = nnx.eval_shape(lambda: HybridLM(cfg, rngs=nnx.Rngs(0)))
    return [
        param_path(path)
        for path, node in nnx.iter_graph(model)
        if isinstance(node, Linear) and type(node.kernel) is nnx.Param and path != ("lm_head",)
    ]


def _dequantized_reason(path: Path_, source: Source, layers: set[Path_]) -> str:
    """Why the dense parameter at `path`, built from FP8 weights, stays dequantized."""
    if source.joint:
        return "a shared kernel with its use site's LoRA adapter folded in"
    if path[:-1] not in layers:
        return "not a dense Linear (the LM head, a router)"
    if len(source.names) > 1 or source.piece is not None:
        return "concatenated from several tensors or a piece of a fused one"
    return "a constant multiplier folded in"


def checkpoint_plan(
    cfg: ModelConfig, sources: Sources, found: QuantizedTensors, shapes: Mapping[str, tuple]
) -> Fp8Plan:
    """The plan of an FP8 checkpoint whose quantized weights are `found` (`shapes`: every
    tensor's)."""
    layers = set(linear_layers(cfg))
    rows, cols = found.scheme.block  # of the [out, in] weight: ours is (cols, rows)
    planned = tuple(
        (layer, (cols, rows))
        for layer in sorted(layers, key=str)
        if sources[(*layer, "kernel")].weight in found.scales
    )
    experts, stack_reasons = expert_plan(sources, found, shapes)
    kept = {(*layer, "kernel") for layer, _ in planned}
    kept |= {(*moe, proj) for moe, _ in experts for proj in EXPERT_STACKS}
    fp8 = fp8_weight_names(found)
    dequantized = tuple(
        (path, stack_reasons.get(path) or _dequantized_reason(path, source, layers))
        for path, source in sources.items()
        if path not in kept and any(fp8(name) for name in source.names)
    )
    return Fp8Plan(planned, dequantized, found.scheme.describe(), experts=experts)


def dynamic_plan(cfg: ModelConfig, sources: Sources) -> Fp8Plan:
    """`quantization="fp8"`'s plan: every dense layer that is one weight, per output channel."""
    layers = sorted(linear_layers(cfg), key=str)
    planned = tuple(
        (layer, PER_CHANNEL) for layer in layers if sources[(*layer, "kernel")].weight is not None
    )
    return Fp8Plan(planned, (), DYNAMIC)


def quantize_channels(kernel: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """An [in, out] kernel as e4m3 entries and fp32 scales [1, out]: amax / 448 per output
    column (1 for an all-zero column), entries divided by it, clipped, rounded to nearest."""
    kernel = np.asarray(kernel, np.float32)
    amax = np.max(np.abs(kernel), axis=0, keepdims=True)
    scale = np.where(amax > 0, amax / np.float32(E4M3_MAX), np.float32(1)).astype(np.float32)
    entries = np.clip(kernel / scale, -E4M3_MAX, E4M3_MAX).astype(ml_dtypes.float8_e4m3fn)
    return entries, scale


def _not_written(_: np.ndarray) -> tuple[np.ndarray, ...]:
    raise ValueError("a model holding FP8 kernels is not written back as a checkpoint")


def _scale_grid(scale: np.ndarray, grid: tuple[int, ...] | None) -> np.ndarray:
    """A stored scale as ours, [G_in, G_out] fp32: transposed (reshaped to the weight's `grid`
    first unless None: stored as the grid, or a slice of it)."""
    scale = np.asarray(scale, np.float32)
    return (scale if grid is None else scale.reshape(grid)).T


def checkpoint_sources(
    plan: Fp8Plan, sources: Sources, found: QuantizedTensors, shapes: Mapping[str, tuple]
) -> Sources:
    """Each planned layer's e4m3 kernel (its weight transposed) and fp32 scale grid, each read
    as slices where a shard reader splits it (a scale stored as its [G_out, G_in] grid)."""
    out: Sources = {}
    block = found.scheme.block
    for layer, _ in plan.layers:
        weight = sources[(*layer, "kernel")].weight
        assert weight is not None  # planned layers are one weight each
        grid, scale = grid_shape(shapes[weight], block), found.scales[weight]
        out[(*layer, "kernel")] = Source(
            (weight,), lambda t: np.asarray(t).T, _not_written, read_axis=swapped_axis
        )
        as_grid = tuple(shapes[scale]) == grid  # else [out], [out, 1], [1] or a scalar
        out[(*layer, "scale")] = Source(
            (scale,),
            functools.partial(_scale_grid, grid=None if as_grid else grid),
            _not_written,
            read_axis=swapped_axis if as_grid else None,  # slice for slice as stored
        )
    return out


def shard_reader_plan(cfg: ModelConfig, tensors: TensorReader) -> Fp8Plan:
    """The plan of a loader that reads the checkpoint shard by shard (`jmamba.checkpoints.
    shards`), from the files' headers alone: `checkpoint_plan`'s dense layers, its expert stacks
    dequantized (`EXPERTS_REASON`)."""
    found = tensors.quantized
    if not found.scales:
        return NO_FP8
    sources = tensor_sources(cfg)
    plan = checkpoint_plan(cfg, sources, found, tensors.stored_shapes)
    stacks = expert_stacks(sources)
    dropped = tuple(((*moe, s), EXPERTS_REASON) for moe, _ in plan.experts for s in stacks[moe])
    return dataclasses.replace(plan, experts=(), dequantized=(*plan.dequantized, *dropped))


def with_checkpoint_quantization(cfg: ModelConfig, model_dir: str | Path) -> ModelConfig:
    """`cfg` (the checkpoint's in `model_dir`) with the plan of a loader that reads it shard by
    shard (`shard_reader_plan`) and its KV-cache scales, read from the headers and the scale
    tensors alone."""
    with TensorReader(model_dir) as tensors:
        plan = shard_reader_plan(cfg, tensors)
    kv = read_kv_scales(model_dir, load_scheme(model_dir), tensor_sources(cfg))
    return dataclasses.replace(cfg, quantization=dataclasses.replace(plan, kv_scales=kv))


def _dynamic_sources(plan: Fp8Plan, sources: Sources) -> Sources:
    """Each planned layer's kernel and scale, quantized from its built fp32 kernel (built once for
    each: a load-time cost, not a memory one)."""
    out: Sources = {}
    for layer, _ in plan.layers:
        source = sources[(*layer, "kernel")]
        for part, name in enumerate(("kernel", "scale")):
            build = lambda *ts, s=source, i=part: quantize_channels(s.build(*ts))[i]  # noqa: E731
            out[(*layer, name)] = Source(source.names, build, _not_written)
    return out


def fp8_load(
    cfg: ModelConfig, scheme: Fp8Scheme, tensors: Tensors, sources: Sources, dynamic: bool
) -> tuple[Tensors, Fp8Plan, Sources]:
    """(tensors, plan, sources) of a whole-model load: the planned layers' FP8 weights and scales
    as they are on disk, every other FP8 weight dequantized (its scales, the activation and
    KV-cache scales consumed, as `dequantized`), and the sources with the planned kernels and
    scales; the plan holds the KV-cache scales (`kv_scales`).
    `dynamic` (`quantization="fp8"`) plans a checkpoint without FP8 weights."""
    shapes = {n: tuple(t.shape) for n, t in tensors.items()}
    found = find_quantized(scheme, shapes, float8_dtypes(tensors))
    kv = kv_scales(scheme, sources, tensors.keys(), tensors.__getitem__)
    if found.scales:
        plan = dataclasses.replace(checkpoint_plan(cfg, sources, found, shapes), kv_scales=kv)
        weights = [sources[(*layer, "kernel")].weight for layer, _ in plan.layers]
        kept = {name for w in weights if w is not None for name in (w, found.scales[w])}
        inputs = {scheme.input_scale_name(w) for w in weights if w is not None}
        stacks, used = expert_tensors(scheme, tensors, found, plan.experts, sources)
        skipped = kept | inputs | used
        rest = dequantized(scheme, {n: t for n, t in tensors.items() if n not in skipped})
        rest.update({name: tensors[name] for name in kept} | stacks)
        planned = {
            **checkpoint_sources(plan, sources, found, shapes),
            **expert_scale_sources(scheme, plan.experts, sources, stacks),
        }
        return rest, plan, {**sources, **planned}
    tensors = dequantized(scheme, tensors)  # a scheme's KV-cache scales, if nothing else
    if not dynamic:
        return tensors, dataclasses.replace(NO_FP8, kv_scales=kv), sources
    plan = dynamic_plan(cfg, sources)
    return tensors, plan, {**sources, **_dynamic_sources(plan, sources)}
