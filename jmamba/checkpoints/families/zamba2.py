"""Zamba2 (`Zamba2ForCausalLM`), `config.json` -> `ModelConfig`.

Layers are Mamba2 mixers ("mamba" / "linear_attention" in `layers_block_type`) or hybrid ones
("hybrid": `Mixer.TRANSFORMER_MAMBA2`, a shared transformer block over [x | embeddings] feeding
the layer's Mamba2 mixer, `jmamba.mixers.transformer_mamba2`); no layer has a separate FFN. Read
as transformers 5.23.0 reads them: the attention works on 2 x hidden_size with head_dim
2 x hidden_size // num_attention_heads and softmax scale (head_dim / 2)^-1/2, RoPE over the whole
head only when `use_mem_rope`; the Mamba2 mixers have head_dim mamba_expand x hidden_size //
n_mamba_heads, dt clamped below at `time_step_min`, the gate before the group norm, whose epsilon
is 1e-5 whatever `rms_norm_eps` says. Fields transformers derives again from these
(`attention_hidden_size`, `attention_head_dim`, `mamba_headdim`, `hybrid_layer_ids`,
`kv_channels`, `num_query_groups`) and those of training or generation only (`use_mem_eff_path`,
`use_mamba_kernels`, `num_logits_to_keep`, initializer ranges, dropouts, `time_step_max`,
`time_step_floor`) are not read.
"""

from __future__ import annotations

import math

from jmamba.checkpoints.families.hf_fields import (
    HFConfig,
    _check_no_bias,
    _common,
    _decode_float,
    _get,
)
from jmamba.config import Ffn, Mixer, ModelConfig
from jmamba.layer_configs import AttentionConfig, Mamba2Config, SharedBlockConfig

_KINDS = {
    "mamba": Mixer.MAMBA2,
    "linear_attention": Mixer.MAMBA2,
    "hybrid": Mixer.TRANSFORMER_MAMBA2,
}
GATE_NORM_EPS = 1e-5  # transformers' Zamba2RMSNormGated in the Mamba2 mixer, fixed
LONG_CONTEXT = 16384  # `use_long_context` sets max_position_embeddings to this


def _mixers(cfg: HFConfig) -> list[Mixer]:
    """`layers_block_type` (or its alias `layer_types`), one per layer."""
    n = int(_get(cfg, "num_hidden_layers"))
    types = cfg.get("layers_block_type") or _get(cfg, "layer_types", None)
    if types is None:
        raise ValueError("config.json of Zamba2ForCausalLM is missing 'layers_block_type'")
    if len(types) != n or not set(types) <= set(_KINDS):
        raise ValueError(
            f"layers_block_type must list num_hidden_layers={n} of {sorted(_KINDS)}, got {types}"
        )
    return [_KINDS[t] for t in types]


def _mamba2(cfg: HFConfig, hidden: int) -> Mamba2Config:
    inner = int(_get(cfg, "mamba_expand", 2)) * hidden
    heads = int(_get(cfg, "n_mamba_heads", 8))
    if inner % heads:
        raise ValueError(
            f"n_mamba_heads={heads} must divide mamba_expand*hidden_size={inner} (the head dim)"
        )
    return Mamba2Config(
        num_heads=heads,
        head_dim=inner // heads,
        d_state=int(_get(cfg, "mamba_d_state", 64)),
        n_groups=int(_get(cfg, "mamba_ngroups", 1)),
        d_conv=int(_get(cfg, "mamba_d_conv", 4)),
        chunk_size=int(_get(cfg, "chunk_size", 256)),
        conv_bias=bool(_get(cfg, "use_conv_bias", True)),
        dt_limit=(float(_get(cfg, "time_step_min", 0.001)), math.inf),
        gate_norm_eps=GATE_NORM_EPS,
    )


def _attention(cfg: HFConfig, hidden: int, adapters: bool) -> AttentionConfig:
    """The shared blocks' attention on 2 x hidden; with q / k / v adapters (whose outputs are
    2 x hidden wide) transformers needs heads x head_dim = 2 x hidden and as many KV heads."""
    heads = int(_get(cfg, "num_attention_heads", 32))
    kv_heads = int(_get(cfg, "num_key_value_heads", heads))
    head_dim = 2 * hidden // heads
    if adapters and (kv_heads != heads or heads * head_dim != 2 * hidden):
        raise ValueError(
            f"use_shared_attention_adapter needs num_key_value_heads={kv_heads} equal to "
            f"num_attention_heads={heads} and heads dividing 2*hidden_size={2 * hidden}"
        )
    rotary_dim, theta = 0, 10000.0
    if _get(cfg, "use_mem_rope", False):
        params = cfg.get("rope_parameters") or {}
        if params.get("rope_type", "default") != "default":
            raise ValueError(f"rope_type={params['rope_type']!r} is not supported (only 'default')")
        rotary_dim = head_dim
        theta = _decode_float(params.get("rope_theta", cfg.get("rope_theta", theta)))
    return AttentionConfig(
        num_heads=heads,
        num_kv_heads=kv_heads,
        head_dim=head_dim,
        rotary_dim=rotary_dim,
        rope_theta=theta,
        softmax_scale=(head_dim / 2) ** -0.5,
    )


def _shared_block(cfg: HFConfig, hidden: int, adapters: bool) -> SharedBlockConfig:
    if not _get(cfg, "use_shared_mlp_adapter", True):
        raise ValueError(
            "use_shared_mlp_adapter=False is not supported: transformers 5.23.0 always applies "
            "the MLP adapters"
        )
    act = _get(cfg, "hidden_act", "gelu")
    if act not in ("gelu", "silu"):
        raise ValueError(f"hidden_act={act!r} is not supported (only 'gelu' or 'silu')")
    return SharedBlockConfig(
        num_blocks=int(_get(cfg, "num_mem_blocks", 1)),
        intermediate_size=int(_get(cfg, "intermediate_size", 4 * hidden)),
        adapter_rank=int(_get(cfg, "adapter_rank", 128)),
        attention_adapters=adapters,
        activation=act,
    )


def zamba2(cfg: HFConfig) -> ModelConfig:
    """Zamba2ForCausalLM: Mamba2 layers and hybrid layers (`Mixer.TRANSFORMER_MAMBA2`) per
    `layers_block_type`, `num_mem_blocks` shared transformer blocks used in turn by the hybrid
    layers, embeddings tied to the head (`tie_word_embeddings` false is refused)."""
    _check_no_bias(cfg, "add_bias_linear")
    hidden = int(_get(cfg, "hidden_size"))
    adapters = bool(_get(cfg, "use_shared_attention_adapter", False))
    mixers = _mixers(cfg)
    if not _get(cfg, "tie_word_embeddings", True):  # transformers' default for Zamba2: tied
        raise ValueError(
            "tie_word_embeddings=False is not supported for Zamba2: transformers 5.23.0 then "
            "unties the shared transformer blocks too, giving each hybrid layer its own block"
        )
    cfg = {**cfg, "tie_word_embeddings": True}
    if _get(cfg, "use_long_context", False):
        cfg["max_position_embeddings"] = LONG_CONTEXT
    return _common(
        cfg,
        mixers,
        [Ffn.NONE] * len(mixers),
        norm_eps=float(_get(cfg, "rms_norm_eps", 1e-5)),
        attention=_attention(cfg, hidden, adapters),
        mamba2=_mamba2(cfg, hidden),
        shared_block=_shared_block(cfg, hidden, adapters),
    )
