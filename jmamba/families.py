"""Hugging Face `config.json` -> `ModelConfig`, one adapter per architecture.

The layer pattern comes from the config's own fields: `layers_block_type` (NemotronH), `layer_types`
plus `mlp_only_layers` / `decoder_sparse_step` (Qwen3-Next), `layer_types` (Qwen3.5), nothing
(Mamba2: every layer is a Mamba2 mixer). Falcon-H1's adapter is in `jmamba.falcon_family`, Bamba's
and Granite-4.0-H's in `jmamba.ibm_families`, Zamba2's in `jmamba.zamba_family`, the field readers
all adapters share in `jmamba.hf_fields`.

Qwen3.5 as published is a multimodal wrapper (`Qwen3_5ForConditionalGeneration`,
`Qwen3_5MoeForConditionalGeneration`, see `WRAPPERS`): we read its text model, whose config is
nested under `text_config` (see the function `text_config`).
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

from jmamba.config import (
    AttentionConfig,
    Ffn,
    GDNConfig,
    Mamba2Config,
    Mixer,
    MlpConfig,
    ModelConfig,
    MoeConfig,
)
from jmamba.falcon_family import falcon_h1
from jmamba.hf_fields import HFConfig, _check_no_bias, _common, _decode_float, _eos_ids, _get, _rope
from jmamba.ibm_families import bamba, granite_moe_hybrid
from jmamba.zamba_family import zamba2


def _mamba2_mixer(cfg: HFConfig, num_heads: int, head_dim: int, dt_limit: tuple[float, float]):
    return Mamba2Config(
        num_heads=num_heads,
        head_dim=head_dim,
        d_state=int(_get(cfg, "ssm_state_size" if "ssm_state_size" in cfg else "state_size")),
        n_groups=int(_get(cfg, "n_groups")),
        d_conv=int(_get(cfg, "conv_kernel")),
        chunk_size=int(_get(cfg, "chunk_size")),
        conv_bias=bool(cfg.get("use_conv_bias", True)),
        dt_limit=dt_limit,
    )


def mamba2(cfg: HFConfig) -> ModelConfig:
    """Mamba2ForCausalLM: every layer is norm -> Mamba2 mixer -> residual."""
    _check_no_bias(cfg, "use_bias")
    hidden, heads, head_dim = (
        int(_get(cfg, "hidden_size")),
        int(_get(cfg, "num_heads")),
        int(_get(cfg, "head_dim")),
    )
    if heads * head_dim != int(cfg.get("expand", 2)) * hidden:
        raise ValueError(f"num_heads*head_dim={heads * head_dim} must equal expand*hidden_size")
    limit = cfg.get("time_step_limit", (0.0, math.inf))
    mixer = _mamba2_mixer(cfg, heads, head_dim, (_decode_float(limit[0]), _decode_float(limit[1])))
    n = int(_get(cfg, "num_hidden_layers"))
    return _common(
        cfg,
        [Mixer.MAMBA2] * n,
        [Ffn.NONE] * n,
        norm_eps=float(cfg.get("layer_norm_epsilon", 1e-5)),
        mamba2=mixer,
    )


_NEMOTRON_KINDS = {
    "linear_attention": (Mixer.MAMBA2, Ffn.NONE),
    "mamba": (Mixer.MAMBA2, Ffn.NONE),
    "full_attention": (Mixer.ATTENTION, Ffn.NONE),
    "attention": (Mixer.ATTENTION, Ffn.NONE),
    "mlp": (Mixer.NONE, Ffn.MLP),
    "moe": (Mixer.NONE, Ffn.MOE),
}
_NEMOTRON_PATTERN = {"M": "mamba", "*": "attention", "-": "mlp", "E": "moe"}


def nemotron_h(cfg: HFConfig) -> ModelConfig:
    """NemotronHForCausalLM: each layer is one of Mamba2, attention (no RoPE), relu2 MLP or MoE."""
    _check_no_bias(cfg, "use_bias", "mlp_bias", "attention_bias", "mamba_proj_bias")
    if cfg.get("moe_latent_size") is not None:
        raise ValueError("moe_latent_size is not supported")
    pattern = cfg.get("layers_block_type") or cfg.get("layer_types")
    if pattern is None and "hybrid_override_pattern" in cfg:
        pattern = [_NEMOTRON_PATTERN[c] for c in cfg["hybrid_override_pattern"]]
    if not pattern:
        raise ValueError("config.json of NemotronH needs 'layers_block_type'")
    unknown = sorted(set(pattern) - set(_NEMOTRON_KINDS))
    if unknown:
        raise ValueError(
            f"unknown NemotronH layer types {unknown}; allowed {sorted(_NEMOTRON_KINDS)}"
        )
    mixers, ffns = zip(*(_NEMOTRON_KINDS[p] for p in pattern), strict=True)
    # NemotronH clamps dt to (time_step_min, inf) whatever time_step_limit says.
    dt_limit = (float(cfg.get("time_step_min", 0.001)), math.inf)
    act = cfg.get("mlp_hidden_act", "relu2")
    if act != "relu2":
        raise ValueError(f"mlp_hidden_act={act!r} is not supported (only 'relu2')")
    return _common(
        cfg,
        list(mixers),
        list(ffns),
        norm_eps=float(cfg.get("layer_norm_epsilon", 1e-5)),
        attention=AttentionConfig(
            num_heads=int(_get(cfg, "num_attention_heads")),
            num_kv_heads=int(_get(cfg, "num_key_value_heads")),
            head_dim=int(_get(cfg, "head_dim")),
        ),
        mamba2=_mamba2_mixer(
            cfg, int(_get(cfg, "mamba_num_heads")), int(_get(cfg, "mamba_head_dim")), dt_limit
        ),
        mlp=MlpConfig(int(_get(cfg, "intermediate_size")), "relu2"),
        moe=MoeConfig(
            num_experts=int(_get(cfg, "n_routed_experts")),
            top_k=int(_get(cfg, "num_experts_per_tok")),
            intermediate_size=int(_get(cfg, "moe_intermediate_size")),
            shared_intermediate_size=int(_get(cfg, "moe_shared_expert_intermediate_size")),
            activation="relu2",
            router="sigmoid_grouped",
            norm_topk_prob=bool(cfg.get("norm_topk_prob", True)),
            routed_scaling_factor=float(cfg.get("routed_scaling_factor", 1.0)),
            n_group=int(cfg.get("n_group", 1)),
            topk_group=int(cfg.get("topk_group", 1)),
        )
        if Ffn.MOE in ffns
        else None,
    )


def _qwen_layer_mixers(cfg: HFConfig) -> list[Mixer]:
    kinds = {"linear_attention": Mixer.GDN, "full_attention": Mixer.ATTENTION}
    layer_types = _get(cfg, "layer_types")
    unknown = sorted(set(layer_types) - set(kinds))
    if unknown:
        raise ValueError(f"unknown layer_types {unknown}; allowed {sorted(kinds)}")
    return [kinds[t] for t in layer_types]


def _qwen_model(cfg: HFConfig, ffns: list[Ffn], moe: MoeConfig | None) -> ModelConfig:
    _check_no_bias(cfg, "attention_bias")
    if cfg.get("hidden_act", "silu") != "silu":
        raise ValueError(f"hidden_act={cfg['hidden_act']!r} is not supported (only 'silu')")
    head_dim = int(_get(cfg, "head_dim"))
    rotary_dim, theta = _rope(cfg, head_dim)
    intermediate = cfg.get("intermediate_size")
    return _common(
        cfg,
        _qwen_layer_mixers(cfg),
        ffns,
        norm_eps=float(cfg.get("rms_norm_eps", 1e-6)),
        norm_offset=1.0,
        attention=AttentionConfig(
            num_heads=int(_get(cfg, "num_attention_heads")),
            num_kv_heads=int(_get(cfg, "num_key_value_heads")),
            head_dim=head_dim,
            rotary_dim=rotary_dim,
            rope_theta=theta,
            output_gate=True,
            qk_norm=True,
        ),
        gdn=GDNConfig(
            num_k_heads=int(_get(cfg, "linear_num_key_heads")),
            num_v_heads=int(_get(cfg, "linear_num_value_heads")),
            head_k_dim=int(_get(cfg, "linear_key_head_dim")),
            head_v_dim=int(_get(cfg, "linear_value_head_dim")),
            d_conv=int(_get(cfg, "linear_conv_kernel_dim")),
        ),
        mlp=MlpConfig(int(intermediate)) if intermediate and Ffn.MLP in ffns else None,
        moe=moe,
    )


def _qwen_moe(cfg: HFConfig, norm_topk_prob: bool) -> MoeConfig:
    return MoeConfig(
        num_experts=int(_get(cfg, "num_experts")),
        top_k=int(_get(cfg, "num_experts_per_tok")),
        intermediate_size=int(_get(cfg, "moe_intermediate_size")),
        shared_intermediate_size=int(_get(cfg, "shared_expert_intermediate_size")),
        norm_topk_prob=norm_topk_prob,
        shared_gate=True,
    )


def qwen3_next(cfg: HFConfig) -> ModelConfig:
    """Qwen3NextForCausalLM: GDN or gated attention, then a dense MLP or MoE per layer."""
    n = len(_get(cfg, "layer_types"))
    dense_layers = set(cfg.get("mlp_only_layers") or [])
    step = int(cfg.get("decoder_sparse_step", 1))
    has_experts = int(cfg.get("num_experts", 0)) > 0
    ffns = [
        Ffn.MOE if has_experts and i not in dense_layers and (i + 1) % step == 0 else Ffn.MLP
        for i in range(n)
    ]
    moe = _qwen_moe(cfg, bool(cfg.get("norm_topk_prob", True))) if Ffn.MOE in ffns else None
    return _qwen_model(cfg, ffns, moe)


def qwen3_5(cfg: HFConfig) -> ModelConfig:
    """Qwen3_5ForCausalLM (dense text model): every layer has a dense MLP.

    Qwen3.5's rotary embedding is M-RoPE (`mrope_section`, `mrope_interleaved` in
    `rope_parameters`): three position streams (time, height, width) interleaved over the rotary
    frequencies. On text all three are the token's position, which makes it the plain RoPE we
    apply, so those two fields are not read."""
    return _qwen_model(cfg, [Ffn.MLP] * len(_get(cfg, "layer_types")), None)


def qwen3_5_moe(cfg: HFConfig) -> ModelConfig:
    """Qwen3_5MoeForCausalLM: every layer is MoE; top-k weights are always renormalised."""
    return _qwen_model(cfg, [Ffn.MOE] * len(_get(cfg, "layer_types")), _qwen_moe(cfg, True))


FAMILIES: dict[str, Callable[[HFConfig], ModelConfig]] = {
    "Mamba2ForCausalLM": mamba2,
    "NemotronHForCausalLM": nemotron_h,
    "Qwen3NextForCausalLM": qwen3_next,
    "Qwen3_5ForCausalLM": qwen3_5,
    "Qwen3_5MoeForCausalLM": qwen3_5_moe,
    "FalconH1ForCausalLM": falcon_h1,
    "BambaForCausalLM": bamba,
    "GraniteMoeHybridForCausalLM": granite_moe_hybrid,
    "Zamba2ForCausalLM": zamba2,
}
# Multimodal wrappers -> the class of their text model. We serve the text model: its config is the
# wrapper's `text_config`, its tensors are under `model.language_model.` (`lm_head.` at the top),
# and the vision tower's tensors are skipped (`jmamba.weights.skipped_tensors`). The
# `ModelConfig.architecture` stays the wrapper's name, which picks those tensor names.
WRAPPERS: dict[str, str] = {
    "Qwen3_5ForConditionalGeneration": "Qwen3_5ForCausalLM",
    "Qwen3_5MoeForConditionalGeneration": "Qwen3_5MoeForCausalLM",
}
# The wrapper's own fields that count for its text model, read as transformers reads them:
# `tie_word_embeddings` ties `lm_head` to `model.language_model.embed_tokens` when the wrapper's
# field says so (`PreTrainedModel.get_expanded_tied_weights_keys` reads the wrapper's config), and
# `GenerationConfig.from_model_config` takes `eos_token_id` from the wrapper's config first and
# from `text_config` only when the wrapper has none.
_WRAPPER_FIELDS = ("tie_word_embeddings", "eos_token_id")


def text_config(cfg: HFConfig) -> HFConfig:
    """The config of the text model of a wrapper config.json (see `WRAPPERS`): its `text_config`,
    with the wrapper's `tie_word_embeddings` and `eos_token_id` where the wrapper sets them (each
    falls back to `text_config`'s own, or the default, when the wrapper has none) and the wrapper's
    class as `architectures`. `vision_config` and the wrapper's multimodal token ids are not read.
    Every other field (`vocab_size`, `max_position_embeddings`, `rope_parameters`, ...) is
    `text_config`'s: transformers' `Qwen3_5Config` has no top-level copy of them."""
    arch = cfg["architectures"][0]
    text = cfg.get("text_config")
    if not isinstance(text, dict):
        raise ValueError(f"config.json of {arch} has no 'text_config' object (the text model's)")
    text = dict(text)
    for key in _WRAPPER_FIELDS:
        if cfg.get(key) is not None:
            text[key] = cfg[key]
    text["architectures"] = [arch]
    return text


def from_hf_config(cfg: HFConfig) -> ModelConfig:
    """`ModelConfig` from a parsed HF `config.json`; unknown architectures raise ValueError. A
    multimodal wrapper (`WRAPPERS`) gives the `ModelConfig` of its text model."""
    archs = cfg.get("architectures") or []
    if len(archs) == 1 and archs[0] in WRAPPERS:
        return FAMILIES[WRAPPERS[archs[0]]](text_config(cfg))
    if len(archs) != 1 or archs[0] not in FAMILIES:
        raise ValueError(
            f"architectures={archs} is not supported; expected one of "
            f"{sorted([*FAMILIES, *WRAPPERS])}"
        )
    return FAMILIES[archs[0]](cfg)


def load_hf_config(model_dir: str | Path) -> ModelConfig:
    """Read `<model_dir>/config.json` into a `ModelConfig`.

    The EOS ids are those of config.json and, when the directory has one, generation_config.json
    (transformers' `generate` stops at the latter; checkpoints often list more ids there).
    """
    path = Path(model_dir) / "config.json"
    if not path.is_file():
        raise ValueError(f"no config.json in {model_dir}")
    config = from_hf_config(read_json(path))
    generation = Path(model_dir) / "generation_config.json"
    if not generation.is_file():
        return config
    eos = _eos_ids(read_json(generation), str(generation))
    return dataclasses.replace(config, eos_token_ids=_union(config.eos_token_ids, eos))


def read_json(path: Path) -> dict[str, Any]:
    """A JSON object from `path`; ValueError naming the file if it is not one."""
    try:
        value = json.loads(path.read_bytes())
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise ValueError(f"{path} is not valid JSON: {error}") from None
    if not isinstance(value, dict):
        raise ValueError(f"{path} must hold a JSON object, not a {type(value).__name__}")
    return value


def _union(first: tuple[int, ...], second: tuple[int, ...]) -> tuple[int, ...]:
    return tuple(dict.fromkeys(first + second))
