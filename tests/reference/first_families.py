"""The first fixture families: Mamba2, NemotronH, Qwen3-Next, Qwen3.5 and Qwen3.5 MoE, each with
power-of-two dims and as an `*_odd` twin, and Qwen3.5 as published (the multimodal wrappers,
`*_vl`): each a function giving the HF model class and its tiny random config."""

from __future__ import annotations

from typing import Any

import transformers
from fixture_ids import IDS, VOCAB


def mamba2() -> tuple[type, Any]:
    """Mamba2: 2 Mamba2 layers, default time_step_limit (0, inf) so prefill and decode agree."""
    cfg = transformers.Mamba2Config(
        hidden_size=64,
        num_hidden_layers=2,
        num_heads=8,
        head_dim=16,
        expand=2,
        state_size=16,
        n_groups=2,
        conv_kernel=4,
        chunk_size=16,
        time_step_rank=8,
        **IDS,
    )
    return transformers.Mamba2ForCausalLM, cfg


def nemotron_h() -> tuple[type, Any]:
    """NemotronH: Mamba2 / MLP / attention / group-limited sigmoid MoE with scaling."""
    cfg = transformers.NemotronHConfig(
        hidden_size=64,
        layers_block_type=[
            "linear_attention",
            "mlp",
            "full_attention",
            "moe",
            "linear_attention",
            "moe",
        ],
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        intermediate_size=128,
        mlp_hidden_act="relu2",
        mamba_num_heads=8,
        mamba_head_dim=16,
        ssm_state_size=16,
        n_groups=2,
        conv_kernel=4,
        chunk_size=16,
        n_routed_experts=8,
        num_experts_per_tok=2,
        n_group=2,
        topk_group=1,
        norm_topk_prob=True,
        routed_scaling_factor=2.5,
        moe_intermediate_size=32,
        moe_shared_expert_intermediate_size=32,
        **IDS,
    )
    return transformers.NemotronHForCausalLM, cfg


GDN_COMMON = dict(
    hidden_size=64,
    num_hidden_layers=4,
    layer_types=["linear_attention", "linear_attention", "linear_attention", "full_attention"],
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
    linear_num_key_heads=2,
    linear_num_value_heads=4,
    linear_key_head_dim=16,
    linear_value_head_dim=16,
    linear_conv_kernel_dim=4,
    **IDS,
)


def qwen3_next() -> tuple[type, Any]:
    """Qwen3-Next: 3 GDN + 1 gated attention; layer 1 dense MLP, the rest MoE + shared expert."""
    cfg = transformers.Qwen3NextConfig(
        intermediate_size=128,
        num_experts=4,
        num_experts_per_tok=2,
        moe_intermediate_size=32,
        shared_expert_intermediate_size=32,
        decoder_sparse_step=1,
        mlp_only_layers=[1],
        norm_topk_prob=True,
        **GDN_COMMON,
    )
    return transformers.Qwen3NextForCausalLM, cfg


def qwen3_5() -> tuple[type, Any]:
    """Qwen3.5 dense text model: split GDN projections, dense MLP everywhere."""
    cfg = transformers.Qwen3_5TextConfig(intermediate_size=128, **GDN_COMMON)
    return transformers.Qwen3_5ForCausalLM, cfg


def qwen3_5_moe() -> tuple[type, Any]:
    """Qwen3.5 MoE text model: every layer MoE with a shared expert."""
    cfg = transformers.Qwen3_5MoeTextConfig(
        num_experts=4,
        num_experts_per_tok=2,
        moe_intermediate_size=32,
        shared_expert_intermediate_size=32,
        **GDN_COMMON,
    )
    return transformers.Qwen3_5MoeForCausalLM, cfg


def mamba2_odd() -> tuple[type, Any]:
    """Mamba2, odd dims: 6 heads x head_dim 24, d_state 12, 3 groups, conv_dim 216, chunk 32."""
    cfg = transformers.Mamba2Config(
        hidden_size=72,
        num_hidden_layers=2,
        num_heads=6,
        head_dim=24,
        expand=2,
        state_size=12,
        n_groups=3,
        conv_kernel=4,
        chunk_size=32,
        time_step_rank=5,
        **IDS,
    )
    return transformers.Mamba2ForCausalLM, cfg


def nemotron_h_odd() -> tuple[type, Any]:
    """NemotronH, odd dims: Mamba2 5 heads x 24, d_state 24, 5 groups (conv_dim 360), chunk 16;
    attention 6 heads / 3 KV heads x 24; 6 experts in 3 groups, top-2 from the best 2 groups."""
    cfg = transformers.NemotronHConfig(
        hidden_size=72,
        layers_block_type=[
            "linear_attention",
            "moe",
            "full_attention",
            "mlp",
            "linear_attention",
            "moe",
        ],
        num_attention_heads=6,
        num_key_value_heads=3,
        head_dim=24,
        intermediate_size=96,
        mlp_hidden_act="relu2",
        mamba_num_heads=5,
        mamba_head_dim=24,
        ssm_state_size=24,
        n_groups=5,
        conv_kernel=4,
        chunk_size=16,
        n_routed_experts=6,
        num_experts_per_tok=2,
        n_group=3,
        topk_group=2,
        norm_topk_prob=True,
        routed_scaling_factor=1.5,
        moe_intermediate_size=40,
        moe_shared_expert_intermediate_size=24,
        **IDS,
    )
    return transformers.NemotronHForCausalLM, cfg


def _gdn_odd(k_heads: int, v_heads: int, d_v: int, head_dim: int, kv_heads: int) -> dict:
    """Odd GDN hybrid dims: hidden 40, head_k_dim 24 (the H100 bug's), 6 attention heads."""
    return dict(
        hidden_size=40,
        num_hidden_layers=3,
        layer_types=["linear_attention", "linear_attention", "full_attention"],
        num_attention_heads=6,
        num_key_value_heads=kv_heads,
        head_dim=head_dim,
        linear_num_key_heads=k_heads,
        linear_num_value_heads=v_heads,
        linear_key_head_dim=24,
        linear_value_head_dim=d_v,
        linear_conv_kernel_dim=4,
        **IDS,
    )


def qwen3_next_odd() -> tuple[type, Any]:
    """Qwen3-Next, odd dims: GDN 3 key / 6 value heads, d_v 40; attention 6 / 3 x 24; 6 experts."""
    cfg = transformers.Qwen3NextConfig(
        intermediate_size=96,
        num_experts=6,
        num_experts_per_tok=2,
        moe_intermediate_size=40,
        shared_expert_intermediate_size=24,
        decoder_sparse_step=1,
        mlp_only_layers=[1],
        norm_topk_prob=True,
        **_gdn_odd(3, 6, 40, 24, 3),
    )
    return transformers.Qwen3NextForCausalLM, cfg


def qwen3_5_odd() -> tuple[type, Any]:
    """Qwen3.5 dense, odd dims: GDN 3 key / 6 value heads, d_v 48; attention 6 / 3 x head_dim 80."""
    cfg = transformers.Qwen3_5TextConfig(intermediate_size=96, **_gdn_odd(3, 6, 48, 80, 3))
    return transformers.Qwen3_5ForCausalLM, cfg


def qwen3_5_moe_odd() -> tuple[type, Any]:
    """Qwen3.5 MoE, odd dims: GDN 1 key / 5 value heads, d_v 40 (conv_dim 248); attention 6 / 2 x
    24; 6 experts, top-3."""
    cfg = transformers.Qwen3_5MoeTextConfig(
        num_experts=6,
        num_experts_per_tok=3,
        moe_intermediate_size=40,
        shared_expert_intermediate_size=24,
        **_gdn_odd(1, 5, 40, 24, 2),
    )
    return transformers.Qwen3_5MoeForCausalLM, cfg


# A vision tower as small as Qwen3.5's can be: 2 blocks of width 24, 2x2 merge (out 40 = hidden).
_VISION = dict(
    depth=2,
    hidden_size=24,
    intermediate_size=40,
    num_heads=2,
    patch_size=4,
    spatial_merge_size=2,
    temporal_patch_size=2,
    out_hidden_size=40,
    num_position_embeddings=16,
)
# The multimodal token ids lie past the vocabulary: the text-only sequences never hold them.
_VISION_TOKENS = dict(
    image_token_id=VOCAB,
    video_token_id=VOCAB + 1,
    vision_start_token_id=VOCAB + 2,
    vision_end_token_id=VOCAB + 3,
)


def qwen3_5_vl() -> tuple[type, Any]:
    """Qwen3.5 dense as published: `Qwen3_5ForConditionalGeneration` (text model under
    `model.language_model.`, a vision tower under `model.visual.`), the text model of
    `qwen3_5_odd` with `lm_head` tied to the embedding, as the small Qwen3.5 checkpoints are
    (`tie_word_embeddings` at the top level, where transformers reads it, and in `text_config`)."""
    text = dict(intermediate_size=96, tie_word_embeddings=True, **_gdn_odd(3, 6, 48, 80, 3))
    cfg = transformers.Qwen3_5Config(
        text_config=text, vision_config=_VISION, tie_word_embeddings=True, **_VISION_TOKENS
    )
    return transformers.Qwen3_5ForConditionalGeneration, cfg


def qwen3_5_moe_vl() -> tuple[type, Any]:
    """Qwen3.5 MoE as published: `Qwen3_5MoeForConditionalGeneration`, the text model of
    `qwen3_5_moe_odd`, untied; written with its experts packed (see `Fixture.packed_experts`)."""
    text = dict(
        num_experts=6,
        num_experts_per_tok=3,
        moe_intermediate_size=40,
        shared_expert_intermediate_size=24,
        **_gdn_odd(1, 5, 40, 24, 2),
    )
    cfg = transformers.Qwen3_5MoeConfig(text_config=text, vision_config=_VISION, **_VISION_TOKENS)
    return transformers.Qwen3_5MoeForConditionalGeneration, cfg
