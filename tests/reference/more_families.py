"""The fixture families added after the first ones: Falcon-H1, Bamba, Granite-4.0-H and Zamba2,
each with power-of-two dims and as an `*_odd` twin: each a function giving the HF model class and
its tiny random config."""

from __future__ import annotations

from typing import Any

import transformers
from fixture_ids import IDS


def falcon_h1() -> tuple[type, Any]:
    """Falcon-H1: 2 layers of attention + Mamba2 side by side, then a SwiGLU MLP. The Mamba2 half
    has the gated group norm with the norm before the gate (2 groups), d_ssm from expand; every
    muP multiplier is away from 1 (and each one different) so a folding error shows."""
    cfg = transformers.FalconH1Config(
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        intermediate_size=128,
        mamba_d_ssm=None,
        mamba_expand=2,
        mamba_n_heads=8,
        mamba_d_head="auto",
        mamba_n_groups=2,
        mamba_d_state=16,
        mamba_d_conv=4,
        mamba_chunk_size=16,
        mamba_rms_norm=True,
        mamba_norm_before_gate=True,
        rope_theta=1000.0,
        embedding_multiplier=1.7,
        lm_head_multiplier=0.6,
        attention_in_multiplier=1.3,
        attention_out_multiplier=0.8,
        key_multiplier=0.7,
        ssm_in_multiplier=1.25,
        ssm_out_multiplier=0.9,
        ssm_multipliers=[0.9, 1.1, 0.8, 1.2, 0.7],
        mlp_multipliers=[0.85, 1.15],
        **IDS,
    )
    return transformers.FalconH1ForCausalLM, cfg


def falcon_h1_odd() -> tuple[type, Any]:
    """Falcon-H1, odd dims and the released checkpoints' Mamba2 settings (no norm: y * silu(z),
    one group): attention 6 / 2 KV heads x head_dim 20 (not hidden / heads = 12); Mamba2
    mamba_d_ssm 120 (not expand * hidden) = 5 heads x 24, d_state 12 (conv_dim 144), chunk 32;
    MLP 96; other multipliers than falcon_h1's."""
    cfg = transformers.FalconH1Config(
        hidden_size=72,
        num_hidden_layers=2,
        num_attention_heads=6,
        num_key_value_heads=2,
        head_dim=20,
        intermediate_size=96,
        mamba_d_ssm=120,
        mamba_n_heads=5,
        mamba_d_head=24,
        mamba_n_groups=1,
        mamba_d_state=12,
        mamba_d_conv=4,
        mamba_chunk_size=32,
        mamba_rms_norm=False,
        mamba_norm_before_gate=False,
        rope_theta=5000.0,
        embedding_multiplier=2.2,
        lm_head_multiplier=0.45,
        attention_in_multiplier=0.75,
        attention_out_multiplier=1.4,
        key_multiplier=1.6,
        ssm_in_multiplier=0.8,
        ssm_out_multiplier=1.3,
        ssm_multipliers=[1.2, 0.7, 1.3, 0.6, 1.5],
        mlp_multipliers=[1.25, 0.65],
        **IDS,
    )
    return transformers.FalconH1ForCausalLM, cfg


def bamba() -> tuple[type, Any]:
    """Bamba: Mamba2 layers 0, 1, 3 and attention at 2 (RoPE on half of each head: 8 of 16); a
    SwiGLU MLP in every layer."""
    cfg = transformers.BambaConfig(
        hidden_size=64,
        num_hidden_layers=4,
        attn_layer_indices=[2],
        num_attention_heads=4,
        num_key_value_heads=2,
        intermediate_size=128,
        mamba_n_heads=8,
        mamba_d_head=16,
        mamba_n_groups=2,
        mamba_d_state=16,
        mamba_d_conv=4,
        mamba_chunk_size=16,
        **IDS,
    )
    return transformers.BambaForCausalLM, cfg


def bamba_odd() -> tuple[type, Any]:
    """Bamba, odd dims: attention first (6 / 2 heads x 12, rotary 6), then two Mamba2 layers of 6
    heads x 24, d_state 20, 3 groups (conv_dim 264), chunk 32, no conv bias; MLP 96."""
    cfg = transformers.BambaConfig(
        hidden_size=72,
        num_hidden_layers=3,
        attn_layer_indices=[0],
        num_attention_heads=6,
        num_key_value_heads=2,
        intermediate_size=96,
        mamba_n_heads=6,
        mamba_d_head=24,
        mamba_n_groups=3,
        mamba_d_state=20,
        mamba_d_conv=4,
        mamba_chunk_size=32,
        mamba_conv_bias=False,
        **IDS,
    )
    return transformers.BambaForCausalLM, cfg


def granite_h() -> tuple[type, Any]:
    """Granite-4.0-H (GraniteMoeHybrid): Mamba2, attention without RoPE ("nope", as the hub's),
    Mamba2, Mamba2; MoE (4 experts, top-2) + shared MLP in every layer; every multiplier away
    from 1 (attention_multiplier 1/head_dim like the hub's, not 1/sqrt(head_dim))."""
    cfg = transformers.GraniteMoeHybridConfig(
        hidden_size=64,
        num_hidden_layers=4,
        layer_types=["mamba", "attention", "mamba", "mamba"],
        position_embedding_type="nope",
        num_attention_heads=4,
        num_key_value_heads=2,
        num_local_experts=4,
        num_experts_per_tok=2,
        intermediate_size=32,
        shared_intermediate_size=32,
        mamba_n_heads=8,
        mamba_d_head=16,
        mamba_n_groups=2,
        mamba_d_state=16,
        mamba_d_conv=4,
        mamba_chunk_size=16,
        embedding_multiplier=12.0,
        residual_multiplier=0.22,
        attention_multiplier=1 / 16,
        logits_scaling=1.5,
        **IDS,
    )
    return transformers.GraniteMoeHybridForCausalLM, cfg


def granite_h_odd() -> tuple[type, Any]:
    """Granite-4.0-H, odd dims: Mamba2 (3 heads x 48, d_state 20, 1 group, conv_dim 184, chunk
    16), attention with RoPE over the whole head (6 / 3 heads x 12), Mamba2; MoE 6 experts top-3
    (expert 40, shared 24); tied embeddings (so the embedding multiplier cannot be folded)."""
    cfg = transformers.GraniteMoeHybridConfig(
        hidden_size=72,
        num_hidden_layers=3,
        layer_types=["linear_attention", "full_attention", "linear_attention"],
        position_embedding_type="rope",
        num_attention_heads=6,
        num_key_value_heads=3,
        num_local_experts=6,
        num_experts_per_tok=3,
        intermediate_size=40,
        shared_intermediate_size=24,
        mamba_n_heads=3,
        mamba_d_head=48,
        mamba_n_groups=1,
        mamba_d_state=20,
        mamba_d_conv=4,
        mamba_chunk_size=16,
        embedding_multiplier=6.0,
        residual_multiplier=0.3,
        attention_multiplier=1 / 12,
        logits_scaling=3.0,
        tie_word_embeddings=True,
        **IDS,
    )
    return transformers.GraniteMoeHybridForCausalLM, cfg


def zamba2() -> tuple[type, Any]:
    """Zamba2: Mamba2, then hybrid layers 1, 2, 4, 5 (a shared transformer block feeding the
    layer's Mamba2 mixer) using 2 shared blocks in turn (block 0 at 1 and 4, block 1 at 2 and 5);
    LoRA adapters of rank 8 on q, k, v and gate | up at every use site; attention 4 heads x 32 on
    2 x hidden, no RoPE; Mamba2 8 heads x 16, N 16, 2 groups, chunk 16; tied head (transformers
    ties the shared blocks only when it ties the head)."""
    cfg = transformers.Zamba2Config(
        hidden_size=64,
        num_hidden_layers=6,
        layers_block_type=["mamba", "hybrid", "hybrid", "mamba", "hybrid", "hybrid"],
        num_mem_blocks=2,
        num_attention_heads=4,
        intermediate_size=128,
        adapter_rank=8,
        use_shared_attention_adapter=True,
        use_mem_rope=False,
        n_mamba_heads=8,
        mamba_expand=2,
        mamba_d_state=16,
        mamba_ngroups=2,
        mamba_d_conv=4,
        chunk_size=16,
        **IDS,
    )
    return transformers.Zamba2ForCausalLM, cfg


def zamba2_odd() -> tuple[type, Any]:
    """Zamba2, odd dims: hybrid first, 5 hybrid layers over 2 shared blocks (block 0 at 0, 3, 6;
    block 1 at 2, 5), adapters of rank 5 everywhere; attention 5 heads x 24 on 2 x 60 with RoPE
    (theta 5000); Mamba2 5 heads x 24, N 12, 1 group (conv_dim 144), chunk 32; MLP 84;
    rms_norm_eps 1e-6 (the Mamba2 gated norm keeps 1e-5); tied head, as published."""
    cfg = transformers.Zamba2Config(
        hidden_size=60,
        num_hidden_layers=7,
        layers_block_type=["hybrid", "mamba", "hybrid", "hybrid", "mamba", "hybrid", "hybrid"],
        num_mem_blocks=2,
        num_attention_heads=5,
        intermediate_size=84,
        adapter_rank=5,
        use_shared_attention_adapter=True,
        use_mem_rope=True,
        rope_parameters={"rope_type": "default", "rope_theta": 5000.0},
        n_mamba_heads=5,
        mamba_expand=2,
        mamba_d_state=12,
        mamba_ngroups=1,
        mamba_d_conv=4,
        chunk_size=32,
        rms_norm_eps=1e-6,
        tie_word_embeddings=True,
        **IDS,
    )
    return transformers.Zamba2ForCausalLM, cfg
