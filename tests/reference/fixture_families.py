"""The fixture families of `make_fixtures.py`: each one's tiny random HF model (class and config),
its two sequence lengths and its chunk schedules (`FAMILIES`)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import transformers

VOCAB = 128
IDS = dict(
    vocab_size=VOCAB,
    pad_token_id=0,
    bos_token_id=1,
    eos_token_id=2,
    max_position_embeddings=256,
)


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


@dataclasses.dataclass(frozen=True)
class Fixture:
    """One fixture: its model, its two sequence lengths and its chunk schedules.

    A schedule lists (start, stop) calls on one cache; after the last chunk the sequence goes one
    token per call (decode).
    """

    make: Callable[[], tuple[type, Any]]
    len_a: int
    len_b: int
    chunks_a: tuple[tuple[int, int], ...]
    chunks_b: tuple[tuple[int, int], ...]
    # A multimodal wrapper: the text model's own class, whose logits on the wrapper's language-model
    # weights must equal the wrapper's text-only logits (make_fixtures.check_text_model).
    text_class: type | None = None
    # Write the tensors under their in-memory names (experts packed as `experts.gate_up_proj`
    # [E, 2I, H] and `experts.down_proj` [E, H, I], as the published Qwen3.5 MoE checkpoints hold
    # them) instead of `save_pretrained`'s one tensor per expert.
    packed_experts: bool = False


# The five originals: 80 / 23 tokens, chunk ends on multiples of 16.
_SMALL = dict(len_a=80, len_b=23, chunks_a=((0, 32), (32, 48)), chunks_b=((0, 16),))
# The odd ones: a covers two GDN chunks (64) plus a remainder, b one chunk plus a token; no chunk
# boundary is a multiple of 16, and (50, 139) crosses two GDN chunk ends and starts mid-chunk.
_ODD = dict(
    len_a=181, len_b=65, chunks_a=((0, 50), (50, 139), (139, 170)), chunks_b=((0, 33), (33, 61))
)
FAMILIES: dict[str, Fixture] = {
    "mamba2": Fixture(mamba2, **_SMALL),
    "nemotron_h": Fixture(nemotron_h, **_SMALL),
    "qwen3_next": Fixture(qwen3_next, **_SMALL),
    "qwen3_5": Fixture(qwen3_5, **_SMALL),
    "qwen3_5_moe": Fixture(qwen3_5_moe, **_SMALL),
    "mamba2_odd": Fixture(mamba2_odd, **_ODD),
    "nemotron_h_odd": Fixture(nemotron_h_odd, **_ODD),
    "qwen3_next_odd": Fixture(qwen3_next_odd, **_ODD),
    "qwen3_5_odd": Fixture(qwen3_5_odd, **_ODD),
    "qwen3_5_moe_odd": Fixture(qwen3_5_moe_odd, **_ODD),
    "falcon_h1": Fixture(falcon_h1, **_SMALL),
    "falcon_h1_odd": Fixture(falcon_h1_odd, **_ODD),
    "bamba": Fixture(bamba, **_SMALL),
    "bamba_odd": Fixture(bamba_odd, **_ODD),
    "granite_h": Fixture(granite_h, **_SMALL),
    "granite_h_odd": Fixture(granite_h_odd, **_ODD),
    "zamba2": Fixture(zamba2, **_SMALL),
    "zamba2_odd": Fixture(zamba2_odd, **_ODD),
    "qwen3_5_vl": Fixture(qwen3_5_vl, **_ODD, text_class=transformers.Qwen3_5ForCausalLM),
    "qwen3_5_moe_vl": Fixture(
        qwen3_5_moe_vl, **_ODD, text_class=transformers.Qwen3_5MoeForCausalLM, packed_experts=True
    ),
}
