"""Qwen's Gated DeltaNet hybrids, `config.json` -> `ModelConfig`: Qwen3-Next, Qwen3.5, Qwen3.5-MoE.

Each layer is Gated DeltaNet or gated attention (`layer_types`), then a dense MLP or a MoE:
Qwen3-Next picks by `mlp_only_layers` and `decoder_sparse_step`, Qwen3.5 has a dense MLP in every
layer and Qwen3.5-MoE a MoE in every layer. The published Qwen3.5 checkpoints are multimodal
wrappers whose text model these adapters read (`registry.WRAPPERS`, `registry.text_config`).
"""

from __future__ import annotations

from jmamba.checkpoints.families.hf_fields import HFConfig, _check_no_bias, _common, _get, _rope
from jmamba.config import Ffn, Mixer, ModelConfig
from jmamba.layer_configs import AttentionConfig, GDNConfig, MlpConfig, MoeConfig


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
