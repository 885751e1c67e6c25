"""A model split over T tensor-parallel shards: the config of one shard, and each parameter's rule.

`shard_config(cfg, T)` is the config of one shard: every layer kind holds its own heads, groups,
channels and experts (the per-kind functions next to each layer: `attention_shard`, ...), and
`num_shards = T`, so `HybridLM(shard_config(cfg, T))` is the model one device runs inside
`jax.shard_map`, on local shapes, with the collectives of `jmamba.parallel.collectives`.
`param_rules(cfg)` gives, for every parameter path of `HybridLM(cfg)`, how its whole value splits
into the shards' values (`jmamba.parallel.rules`), gathered from the per-kind rule tables
(`attention_tp_rules`, ...); `shard_values` applies them on the host, so a loader can place each
shard on its own device without the whole model ever sitting on one. An FP8 plan's kernels split
with their scales (`jmamba.parallel.fp8_shards`): a shard config's plan keeps the layers whose
scale blocks the split keeps whole, and `shard_values` dequantizes the others (and FP8 expert
stacks) in the model's dtype.

docs/architecture.md ("Tensor parallelism") has the table of every layer kind's rules.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator

import jax.numpy as jnp
import numpy as np

from jmamba.config import Ffn, Mixer, ModelConfig
from jmamba.layers.fp8_experts import EXPERT_STACKS, dequantized_experts
from jmamba.layers.fp8_linear import dequantized_kernel
from jmamba.layers.mlp import mlp_tp_rules
from jmamba.layers.moe import moe_tp_rules
from jmamba.mixers.attention import attention_shard, attention_tp_rules
from jmamba.mixers.gated_deltanet import gdn_shard, gdn_tp_rules
from jmamba.mixers.mamba2 import mamba2_shard, mamba2_tp_rules
from jmamba.mixers.parallel_hybrid import parallel_hybrid_tp_rules
from jmamba.parallel.fp8_shards import scale_rules, shard_plan
from jmamba.parallel.rules import REPLICATED, Segment, ShardError, ShardRule, split

Path_ = tuple[str | int, ...]
MAX_TENSOR_PARALLEL_SIZE = 64  # the sizes an error message lists as working go up to this


def shard_config(cfg: ModelConfig, shards: int) -> ModelConfig:
    """The config of one of `shards` tensor-parallel shards of the model `cfg` (`cfg` itself
    for one shard). ValueError, naming the field and the sizes that work, when a head, group,
    channel or expert count cannot be split."""
    if shards < 1:
        raise ValueError(f"tensor_parallel_size={shards} must be >= 1")
    try:
        return _local_config(cfg, shards)
    except ShardError as error:
        works = ", ".join(map(str, tensor_parallel_sizes(cfg)))
        raise ValueError(
            f"{error} of {cfg.architecture}; tensor_parallel_size values that work: {works}"
        ) from None


def tensor_parallel_sizes(cfg: ModelConfig) -> list[int]:
    """The shard counts up to `MAX_TENSOR_PARALLEL_SIZE` that split every layer kind of `cfg`."""
    return [t for t in range(1, MAX_TENSOR_PARALLEL_SIZE + 1) if _splits(cfg, t)]


def _splits(cfg: ModelConfig, shards: int) -> bool:
    try:
        _local_config(cfg, shards)
    except ShardError:
        return False
    return True


def _local_config(cfg: ModelConfig, shards: int) -> ModelConfig:
    """Every used layer kind's config of one shard (ShardError when one cannot split)."""
    if shards == 1:
        return cfg
    kinds = {*cfg.mixers, *cfg.ffns, *cfg.mtp_mixers, *cfg.mtp_ffns}
    if Mixer.TRANSFORMER_MAMBA2 in kinds:  # its rules are written down, not yet built
        raise ShardError(
            "mixers: Zamba2's shared transformer blocks (Mixer.TRANSFORMER_MAMBA2) are not split "
            "over tensor parallelism yet"
        )
    attention, mamba2, gdn, mlp, moe = cfg.attention, cfg.mamba2, cfg.gdn, cfg.mlp, cfg.moe
    if kinds & {Mixer.ATTENTION, Mixer.PARALLEL_HYBRID}:
        attention = attention_shard(cfg.need_attention(), shards)
    if kinds & {Mixer.MAMBA2, Mixer.PARALLEL_HYBRID}:
        mamba2 = mamba2_shard(cfg.need_mamba2(), shards)
    if Mixer.GDN in kinds:
        gdn = gdn_shard(cfg.need_gdn(), shards)
    if Ffn.MLP in kinds:
        mlp = cfg.need_mlp()
        size = Segment("mlp.intermediate_size", mlp.intermediate_size).local_units(shards)
        mlp = dataclasses.replace(mlp, intermediate_size=size)
    if Ffn.MOE in kinds:
        moe = cfg.need_moe()
        Segment("moe.num_experts", moe.num_experts).local_units(shards)  # the module splits them
        shared = Segment("moe.shared_intermediate_size", moe.shared_intermediate_size)
        moe = dataclasses.replace(moe, shared_intermediate_size=shared.local_units(shards))
    quantization = cfg.quantization
    if quantization.layers or quantization.experts:
        quantization = shard_plan(quantization, _split_rules(cfg), shards)
    return dataclasses.replace(
        cfg,
        num_shards=shards,
        attention=attention,
        mamba2=mamba2,
        gdn=gdn,
        mlp=mlp,
        moe=moe,
        quantization=quantization,
    )


def _vocab(cfg: ModelConfig) -> Segment:
    return Segment("vocab_size", cfg.vocab_size, padded=True)


def _mixer_rules(kind: Mixer, cfg: ModelConfig) -> dict[tuple[str, ...], ShardRule]:
    """The rules of a mixer's parameters, by their paths under the mixer."""
    match kind:
        case Mixer.ATTENTION:
            return attention_tp_rules(cfg.need_attention())
        case Mixer.MAMBA2:
            return mamba2_tp_rules(cfg.need_mamba2())
        case Mixer.GDN:
            return gdn_tp_rules(cfg.need_gdn())
        case Mixer.PARALLEL_HYBRID:
            return parallel_hybrid_tp_rules(cfg.need_attention(), cfg.need_mamba2())
    return {}


def _ffn_rules(kind: Ffn, cfg: ModelConfig) -> dict[tuple[str, ...], ShardRule]:
    """The rules of an FFN's parameters, by their paths under the FFN."""
    match kind:
        case Ffn.MLP:
            mlp = cfg.need_mlp()
            gated = mlp.activation == "silu_gated"
            return mlp_tp_rules("mlp.intermediate_size", mlp.intermediate_size, gated)
        case Ffn.MOE:
            return moe_tp_rules(cfg.need_moe())
    return {}


def param_rules(cfg: ModelConfig, shards: int = 1) -> dict[Path_, ShardRule]:
    """Every parameter path of `HybridLM(cfg)` (a whole model) -> how it splits over tp; with
    the scales of the FP8 kernels that stay FP8 over `shards` shards
    (`jmamba.parallel.fp8_shards`)."""
    rules = _split_rules(cfg)
    return rules | scale_rules(cfg.quantization, rules, shards)


def _split_rules(cfg: ModelConfig) -> dict[Path_, ShardRule]:
    """`param_rules` but the FP8 scales'."""
    rules: dict[Path_, ShardRule] = {
        ("embed",): split(0, _vocab(cfg)),
        ("final_norm", "weight"): REPLICATED,
    }
    if not cfg.tie_word_embeddings:
        rules[("lm_head", "kernel")] = split(1, _vocab(cfg))
    for i, (mixer, ffn) in enumerate(zip(cfg.mixers, cfg.ffns, strict=True)):
        rules.update({("layers", i, *k): v for k, v in _layer_rules(mixer, ffn, cfg).items()})
    if cfg.has_mtp:  # the MTP head: its fusion and norms whole, its layers as the model's
        for name in ("embedding_norm", "hidden_norm", "norm"):
            rules[("mtp", name, "weight")] = REPLICATED
        rules[("mtp", "fuse", "kernel")] = REPLICATED
        for i, (mixer, ffn) in enumerate(zip(cfg.mtp_mixers, cfg.mtp_ffns, strict=True)):
            layer = _layer_rules(mixer, ffn, cfg)
            rules.update({("mtp", "layers", i, *k): v for k, v in layer.items()})
    return rules


def _layer_rules(mixer: Mixer, ffn: Ffn, cfg: ModelConfig) -> dict[Path_, ShardRule]:
    """A `jmamba.layer.Layer`'s parameter paths (under the layer) -> how each splits."""
    rules: dict[Path_, ShardRule] = {}
    if mixer != Mixer.NONE:
        rules[("mixer_norm", "weight")] = REPLICATED
        rules.update({("mixer", *path): rule for path, rule in _mixer_rules(mixer, cfg).items()})
    if ffn != Ffn.NONE:
        rules[("ffn_norm", "weight")] = REPLICATED
        rules.update({("ffn", *path): rule for path, rule in _ffn_rules(ffn, cfg).items()})
    return rules


def shard_values(
    cfg: ModelConfig, shards: int, params: dict[Path_, np.ndarray]
) -> Iterator[tuple[Path_, list[np.ndarray]]]:
    """For each (path, whole value) of `params` (host arrays of a whole model of `cfg`), the
    path and its `shards` shard values, in shard order (one parameter at a time)."""
    local = shard_config(cfg, shards)  # a clear error before any slicing
    if shards == 1:  # the whole model is its one shard (also of kinds without rules)
        yield from ((path, [np.asarray(value)]) for path, value in params.items())
        return
    rules = param_rules(cfg, shards)
    values = dequantized_for_shards(cfg, local, params)
    for path, value in values.items():
        rule = rules[path]
        yield path, [rule.take(np.asarray(value), t, shards) for t in range(shards)]


def dequantized_for_shards(
    cfg: ModelConfig, local: ModelConfig, params: dict[Path_, np.ndarray]
) -> dict[Path_, np.ndarray]:
    """`params` (of a whole model of `cfg`) with the FP8 kernels and stacks the shard config
    `local` dequantizes (`jmamba.parallel.fp8_shards.shard_plan`) in the model's dtype, their
    scales left out."""
    kept = set(local.quantization.layers)
    blocks = {(*p, "kernel"): ((*p, "scale"), b) for p, b in cfg.quantization.layers}
    blocks = {k: v for k, v in blocks.items() if (k[:-1], v[1]) not in kept}
    for moe, block in cfg.quantization.experts:
        stacks = [(*moe, s) for s in EXPERT_STACKS if (*moe, s) in params]
        blocks |= {stack: ((*stack[:-1], f"{stack[-1]}_scale"), block) for stack in stacks}
    if not blocks:
        return params
    dtype = np.asarray(params[("embed",)]).dtype  # the model's (`HybridLM.dtype`)
    scales = {scale for scale, _ in blocks.values()}
    out = {}
    for path, value in params.items():
        if path in blocks:
            scale, block = blocks[path]
            dequantize = dequantized_kernel if np.ndim(value) == 2 else dequantized_experts
            exact = dequantize(jnp.asarray(value), jnp.asarray(params[scale]), block)
            value = np.asarray(exact).astype(dtype)
        if path not in scales:
            out[path] = value
    return out
