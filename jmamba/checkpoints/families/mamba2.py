"""Mamba2 (`Mamba2ForCausalLM`) and NemotronH (`NemotronHForCausalLM`), `config.json` ->
`ModelConfig`.

Mamba2's layers are all Mamba2 mixers (its config names no pattern). NemotronH's layer pattern is
`layers_block_type` (or `layer_types`, or the older `hybrid_override_pattern` string): each layer
is one of a Mamba2 mixer, attention without RoPE, a relu2 MLP or a MoE. Both read the Mamba2
mixer's fields the same way (`_mamba2_mixer`).
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
from jmamba.layer_configs import AttentionConfig, Mamba2Config, MlpConfig, MoeConfig


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
