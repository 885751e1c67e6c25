"""Built-in tiny hybrid models: random-weight configurations and trained checkpoints.

* Random-weight presets ('mamba2', 'nemotron_h', 'qwen3_next'), for tests and demos: a config
  only, built with `HybridLM(tiny(name), rngs=...)`. Vocabulary 256 (the byte ids of the shared
  tokenizer), EOS id 2. Tests depend on these exact configurations.
* Trained presets (`trained_names()`, today 'stdlib'): checkpoint directories inside this package
  (`config.json`, `model.safetensors`, `tokenizer.json`, `generation_config.json`, and the
  `training.json` record of how `scripts/train_preset.py` made them), loaded with
  `jmamba.load_pretrained(path(name))` exactly like a downloaded checkpoint.

Every preset is written as the HF `config.json` a real checkpoint of its family would carry, so it
goes through the same adapter (`jmamba.checkpoints.families.registry`) as a downloaded model, and
all of them read text through the byte-level tokenizer of `jmamba.text.tokenizer` and the plain
chat template beside this module (`chat_template.jinja`, `jmamba.text.chat_template`).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from jmamba.checkpoints.families.registry import from_hf_config
from jmamba.config import ModelConfig

_DIR = Path(__file__).parent

_COMMON: dict[str, Any] = dict(
    vocab_size=256,
    hidden_size=64,
    max_position_embeddings=2048,
    eos_token_id=2,
    tie_word_embeddings=False,
)
_QWEN: dict[str, Any] = dict(
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
    linear_num_key_heads=2,
    linear_num_value_heads=4,
    linear_key_head_dim=16,
    linear_value_head_dim=16,
    linear_conv_kernel_dim=4,
    rms_norm_eps=1e-6,
    rope_parameters={"rope_theta": 10000.0, "partial_rotary_factor": 0.25, "rope_type": "default"},
)

_PRESETS: dict[str, dict[str, Any]] = {
    "mamba2": dict(
        architectures=["Mamba2ForCausalLM"],
        num_hidden_layers=2,
        num_heads=8,
        head_dim=16,
        expand=2,
        state_size=16,
        n_groups=2,
        conv_kernel=4,
        chunk_size=16,
    ),
    "nemotron_h": dict(
        architectures=["NemotronHForCausalLM"],
        layers_block_type=["linear_attention", "mlp", "full_attention", "moe"],
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        intermediate_size=128,
        mamba_num_heads=8,
        mamba_head_dim=16,
        ssm_state_size=16,
        n_groups=2,
        conv_kernel=4,
        chunk_size=16,
        n_routed_experts=4,
        num_experts_per_tok=2,
        moe_intermediate_size=32,
        moe_shared_expert_intermediate_size=32,
        n_group=1,
        topk_group=1,
    ),
    "qwen3_next": dict(
        architectures=["Qwen3NextForCausalLM"],
        layer_types=["linear_attention", "linear_attention", "full_attention"],
        intermediate_size=128,
        num_experts=4,
        num_experts_per_tok=2,
        moe_intermediate_size=32,
        shared_expert_intermediate_size=32,
        decoder_sparse_step=1,
        mlp_only_layers=[1],
        **_QWEN,
    ),
}


def random_names() -> list[str]:
    """The presets that are a configuration only (random weights)."""
    return sorted(_PRESETS)


def trained_names() -> list[str]:
    """The presets shipped as checkpoint directories inside this package."""
    return sorted(p.name for p in _DIR.iterdir() if (p / "config.json").is_file())


def names() -> list[str]:
    """Every built-in preset, random-weight and trained."""
    return sorted(random_names() + trained_names())


def path(name: str) -> Path:
    """The checkpoint directory of a trained preset."""
    if name not in trained_names():
        raise ValueError(
            f"preset {name!r} has no checkpoint directory; trained presets are {trained_names()} "
            f"(random-weight presets: {random_names()})"
        )
    return _DIR / name


def hf_config(name: str) -> dict[str, Any]:
    """The HF-style config.json of a preset."""
    if name in _PRESETS:
        return {**_COMMON, **_PRESETS[name]}
    if name in trained_names():
        return json.loads((path(name) / "config.json").read_text())
    raise ValueError(f"unknown preset {name!r}; available presets: {names()}")


def tiny(name: str) -> ModelConfig:
    """The `ModelConfig` of a built-in preset (see `names()`)."""
    return from_hf_config(hf_config(name))
