"""IBM's Mamba2 + attention hybrids, `config.json` -> `ModelConfig`: Bamba and Granite-4.0-H.

Both hold transformers' Mamba2 mixer (the SSD of `jmamba.mixers.mamba2`: in_proj [z | xBC | dt],
gated RMSNorm over d_inner / n_groups with the gate before the norm, conv activation `hidden_act`)
under `mamba_*` fields, and plain attention layers. Bamba (`attn_layer_indices`) has partial RoPE
and a SwiGLU MLP per layer. Granite-4.0-H (`layer_types`) has RoPE or none
(`position_embedding_type`), a top-k softmax MoE plus a shared SwiGLU MLP per layer, and four
constant multipliers (embedding, residual, attention softmax scale, logits). Fields that only
matter in training (`z_loss_coefficient`, `router_aux_loss_coef`, `output_router_logits`,
dropouts, initializer ranges) are not read.
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


def _mamba2(cfg: HFConfig) -> Mamba2Config:
    """The Mamba2 mixer from the `mamba_*` fields (transformers' defaults where absent;
    `mamba_d_head` "auto" is mamba_expand * hidden_size / mamba_n_heads)."""
    _check_no_bias(cfg, "mamba_proj_bias")
    if cfg.get("hidden_act", "silu") != "silu":  # the conv activation, the MLP's and the experts'
        raise ValueError(f"hidden_act={cfg['hidden_act']!r} is not supported (only 'silu')")
    inner = int(_get(cfg, "mamba_expand", 2)) * int(_get(cfg, "hidden_size"))
    heads, head_dim = int(_get(cfg, "mamba_n_heads", 128)), _get(cfg, "mamba_d_head", "auto")
    head_dim = inner // heads if head_dim == "auto" else int(head_dim)
    if heads * head_dim != inner:
        raise ValueError(
            f"mamba_n_heads*mamba_d_head={heads * head_dim} must equal "
            f"mamba_expand*hidden_size={inner}"
        )
    # transformers clamps dt to time_step_limit in prefill only; the default (0, inf) is a no-op.
    limit = _get(cfg, "time_step_limit", (0.0, math.inf))
    return Mamba2Config(
        num_heads=heads,
        head_dim=head_dim,
        d_state=int(_get(cfg, "mamba_d_state", 256)),
        n_groups=int(_get(cfg, "mamba_n_groups", 1)),
        d_conv=int(_get(cfg, "mamba_d_conv", 4)),
        chunk_size=int(_get(cfg, "mamba_chunk_size", 256)),
        conv_bias=bool(_get(cfg, "mamba_conv_bias", True)),
        dt_limit=(_decode_float(limit[0]), _decode_float(limit[1])),
    )


def _rope_parameters(cfg: HFConfig) -> HFConfig:
    """transformers reads a non-null `rope_scaling` in place of `rope_parameters`."""
    return cfg.get("rope_scaling") or cfg.get("rope_parameters") or {}


def _rotary_factor(cfg: HFConfig, default: float, fixed: bool) -> float:
    """`partial_rotary_factor` of `rope_parameters`, else `default`. transformers replaces a
    top-level one (Bamba: by 0.5) or ignores any (Granite, `fixed`): those are refused."""
    factor = float(_rope_parameters(cfg).get("partial_rotary_factor", default))
    top = cfg.get("partial_rotary_factor")
    if (top is not None and float(top) != factor) or (fixed and factor != default):
        raise ValueError(
            f"partial_rotary_factor={factor if top is None else top} is not supported: "
            f"transformers uses {default} for {cfg['architectures'][0]}"
        )
    return factor


def _attention(cfg: HFConfig, rotary_factor: float, softmax_scale: float | None) -> AttentionConfig:
    """The attention layers: `head_dim` if given, else hidden_size / num_attention_heads; RoPE
    (default type only) on the first rotary_factor * head_dim dims, none when it is 0."""
    _check_no_bias(cfg, "attention_bias")
    heads = int(_get(cfg, "num_attention_heads"))
    head_dim = int(_get(cfg, "head_dim", int(_get(cfg, "hidden_size")) // heads))
    params = _rope_parameters(cfg)
    rope_type = params.get("rope_type", params.get("type", "default"))
    if rotary_factor and rope_type != "default":
        raise ValueError(f"rope_type={rope_type!r} is not supported (only 'default')")
    return AttentionConfig(
        num_heads=heads,
        num_kv_heads=int(_get(cfg, "num_key_value_heads", heads)),
        head_dim=head_dim,
        rotary_dim=int(head_dim * rotary_factor),
        rope_theta=_decode_float(params.get("rope_theta", cfg.get("rope_theta", 10000.0))),
        softmax_scale=softmax_scale,
    )


def bamba(cfg: HFConfig) -> ModelConfig:
    """BambaForCausalLM: Mamba2 layers with attention at `attn_layer_indices` (RoPE on
    `partial_rotary_factor` of each head: 0.5 unless `rope_parameters` says otherwise), each layer
    followed by a SwiGLU MLP (`intermediate_size`)."""
    _check_no_bias(cfg, "mlp_bias")
    n = int(_get(cfg, "num_hidden_layers"))
    attention = set(cfg.get("attn_layer_indices") or [])
    outside = sorted(i for i in attention if not 0 <= i < n)
    if outside:
        raise ValueError(f"attn_layer_indices {outside} are outside [0, num_hidden_layers={n})")
    return _common(
        cfg,
        [Mixer.ATTENTION if i in attention else Mixer.MAMBA2 for i in range(n)],
        [Ffn.MLP] * n,
        norm_eps=float(_get(cfg, "rms_norm_eps", 1e-5)),
        attention=_attention(cfg, _rotary_factor(cfg, 0.5, fixed=False), None),
        mamba2=_mamba2(cfg),
        mlp=MlpConfig(int(_get(cfg, "intermediate_size"))),
    )


_GRANITE_KINDS = {  # transformers 5 names, and the older hub files' "mamba" / "attention"
    "linear_attention": Mixer.MAMBA2,
    "mamba": Mixer.MAMBA2,
    "full_attention": Mixer.ATTENTION,
    "attention": Mixer.ATTENTION,
}


def _granite_mixers(cfg: HFConfig) -> list[Mixer]:
    """`layer_types` (all Mamba2 when absent), one per layer."""
    n = int(_get(cfg, "num_hidden_layers"))
    types = _get(cfg, "layer_types", ["linear_attention"] * n)
    if len(types) != n or not set(types) <= set(_GRANITE_KINDS):
        raise ValueError(
            f"layer_types must list num_hidden_layers={n} of {sorted(_GRANITE_KINDS)}, got {types}"
        )
    return [_GRANITE_KINDS[t] for t in types]


def _granite_rotary_factor(cfg: HFConfig) -> float:
    """1 (the whole head) when `position_embedding_type` is "rope", 0 when null or "nope"."""
    position = cfg.get("position_embedding_type")
    if position not in (None, "nope", "rope"):
        raise ValueError(f"position_embedding_type={position!r} must be null, 'nope' or 'rope'")
    return _rotary_factor(cfg, 1.0, fixed=True) if position == "rope" else 0.0


def _granite_moe(cfg: HFConfig, experts: int, shared: int) -> MoeConfig:
    """The block-sparse MoE: top-k of `num_local_experts` SwiGLU experts (`intermediate_size`),
    weighted by the softmax over the k chosen router logits (the softmax's top-k, renormalised),
    plus the shared MLP, ungated."""
    return MoeConfig(
        num_experts=experts,
        top_k=int(_get(cfg, "num_experts_per_tok", 2)),
        intermediate_size=int(_get(cfg, "intermediate_size")),
        shared_intermediate_size=shared,
        norm_topk_prob=True,
    )


def granite_moe_hybrid(cfg: HFConfig) -> ModelConfig:
    """GraniteMoeHybridForCausalLM (Granite-4.0-H): Mamba2 or attention per `layer_types`, then a
    block-sparse MoE plus a shared SwiGLU MLP (`shared_intermediate_size`; the shared MLP alone
    when `num_local_experts` is 0); `embedding_multiplier`, `residual_multiplier`,
    `attention_multiplier` (the softmax scale) and `logits_scaling` (the logits' divisor)."""
    mixers = _granite_mixers(cfg)
    experts = int(_get(cfg, "num_local_experts", 8))
    shared = int(_get(cfg, "shared_intermediate_size", 1024))
    logits_scaling = float(_get(cfg, "logits_scaling", 1.0))
    if logits_scaling == 0:
        raise ValueError("logits_scaling=0 is not supported (the logits are divided by it)")
    ffn = Ffn.MOE if experts > 0 else Ffn.MLP
    return _common(
        cfg,
        mixers,
        [ffn] * len(mixers),
        norm_eps=float(_get(cfg, "rms_norm_eps", 1e-6)),
        embedding_multiplier=float(_get(cfg, "embedding_multiplier", 1.0)),
        residual_multiplier=float(_get(cfg, "residual_multiplier", 1.0)),
        logits_multiplier=1.0 / logits_scaling,
        attention=_attention(
            cfg, _granite_rotary_factor(cfg), float(_get(cfg, "attention_multiplier", 1.0))
        ),
        mamba2=_mamba2(cfg),
        mlp=MlpConfig(shared) if ffn == Ffn.MLP else None,
        moe=_granite_moe(cfg, experts, shared) if ffn == Ffn.MOE else None,
    )
