"""Falcon-H1 (`FalconH1ForCausalLM`), `config.json` -> `ModelConfig`.

Every layer runs attention (full RoPE) and a Mamba2 mixer side by side on one normed input
(`Mixer.PARALLEL_HYBRID`, `jmamba.mixers.parallel_hybrid`), then a SwiGLU MLP. The muP multipliers
inside the layers are folded into the weights at load time (`WeightMultipliers`,
`jmamba.checkpoints.folding`); the embedding's and the head's are `ModelConfig` fields.
"""

from __future__ import annotations

import math

from jmamba.checkpoints.families.hf_fields import (
    HFConfig,
    _check_no_bias,
    _common,
    _decode_float,
    _get,
    _rope,
)
from jmamba.config import Ffn, Mixer, ModelConfig
from jmamba.layer_configs import AttentionConfig, Mamba2Config, MlpConfig
from jmamba.multipliers import WeightMultipliers


def _falcon_gate_norm(cfg: HFConfig) -> str:
    """`Mamba2Config.gate_norm` of Falcon-H1: no norm unless `mamba_rms_norm` (HF's defaults)."""
    if not cfg.get("mamba_rms_norm", False):
        return "gate_only"
    return "norm_then_gate" if cfg.get("mamba_norm_before_gate", True) else "gate_then_norm"


def _falcon_mamba2(cfg: HFConfig) -> Mamba2Config:
    """Falcon-H1's Mamba2 half: d_inner is `mamba_d_ssm`, or expand * hidden where that is null."""
    if "mamba_d_ssm" not in cfg:
        raise ValueError("config.json of FalconH1ForCausalLM is missing the required 'mamba_d_ssm'")
    d_inner = cfg["mamba_d_ssm"]
    if d_inner is None:
        d_inner = int(cfg.get("mamba_expand", 2)) * int(_get(cfg, "hidden_size"))
    heads = int(_get(cfg, "mamba_n_heads"))
    head_dim = _get(cfg, "mamba_d_head", "auto")
    head_dim = int(d_inner) // heads if head_dim == "auto" else int(head_dim)
    if heads * head_dim != int(d_inner):
        raise ValueError(
            f"mamba_n_heads*mamba_d_head={heads * head_dim} must equal mamba_d_ssm={d_inner}"
        )
    limit = cfg.get("time_step_limit") or (0.0, math.inf)
    return Mamba2Config(
        num_heads=heads,
        head_dim=head_dim,
        d_state=int(_get(cfg, "mamba_d_state")),
        n_groups=int(_get(cfg, "mamba_n_groups")),
        d_conv=int(_get(cfg, "mamba_d_conv")),
        chunk_size=int(_get(cfg, "mamba_chunk_size")),
        conv_bias=bool(cfg.get("mamba_conv_bias", True)),
        dt_limit=(_decode_float(limit[0]), _decode_float(limit[1])),
        gate_norm=_falcon_gate_norm(cfg),
    )


def _falcon_multipliers(cfg: HFConfig) -> WeightMultipliers:
    """Falcon-H1's muP multipliers (`ssm_multipliers` per in_proj segment z, x, B, C, dt;
    `mlp_multipliers` = gate, down), each 1.0 where config.json has none."""
    scalar = lambda key: float(_get(cfg, key, 1.0))  # noqa: E731
    segments = tuple(float(m) for m in _get(cfg, "ssm_multipliers", [1.0] * 5))
    gate, down = (float(m) for m in _get(cfg, "mlp_multipliers", [1.0, 1.0]))
    return WeightMultipliers(
        attention_in=scalar("attention_in_multiplier"),
        attention_key=scalar("key_multiplier"),
        attention_out=scalar("attention_out_multiplier"),
        mamba2_in=scalar("ssm_in_multiplier"),
        mamba2_segments=segments,
        mamba2_out=scalar("ssm_out_multiplier"),
        mlp_gate=gate,
        mlp_down=down,
    )


def falcon_h1(cfg: HFConfig) -> ModelConfig:
    """FalconH1ForCausalLM: every layer runs attention (full RoPE) and a Mamba2 mixer side by side
    on one normed input and adds both to the residual, then a SwiGLU MLP; the muP multipliers inside
    the layers are folded into the weights at load time, the embedding's and the head's are
    `ModelConfig` fields."""
    _check_no_bias(cfg, "attention_bias", "mlp_bias", "mamba_proj_bias", "projectors_bias")
    if cfg.get("hidden_act", "silu") != "silu":
        raise ValueError(f"hidden_act={cfg['hidden_act']!r} is not supported (only 'silu')")
    heads = int(_get(cfg, "num_attention_heads"))
    # HF's attention and RoPE both take head_dim when config.json has one, else hidden / heads.
    head_dim = int(cfg.get("head_dim") or int(_get(cfg, "hidden_size")) // heads)
    _, theta = _rope(cfg, head_dim)  # the default RoPE rotates the whole head
    n = int(_get(cfg, "num_hidden_layers"))
    return _common(
        cfg,
        [Mixer.PARALLEL_HYBRID] * n,
        [Ffn.MLP] * n,
        norm_eps=float(cfg.get("rms_norm_eps", 1e-5)),
        attention=AttentionConfig(
            num_heads=heads,
            num_kv_heads=int(_get(cfg, "num_key_value_heads", heads)),
            head_dim=head_dim,
            rotary_dim=head_dim,
            rope_theta=theta,
        ),
        mamba2=_falcon_mamba2(cfg),
        mlp=MlpConfig(int(_get(cfg, "intermediate_size"))),
        embedding_multiplier=float(_get(cfg, "embedding_multiplier", 1.0)),
        logits_multiplier=float(_get(cfg, "lm_head_multiplier", 1.0)),
        multipliers=_falcon_multipliers(cfg),
    )
