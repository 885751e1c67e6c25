"""Hugging Face `config.json` -> `ModelConfig`: the architectures we read, one adapter each.

The layer pattern comes from the config's own fields (each adapter's module says which): Mamba2 and
NemotronH in `mamba2`, Qwen3-Next and Qwen3.5 in `qwen`, Falcon-H1 in `falcon_h1`, Bamba and
Granite-4.0-H in `ibm`, Zamba2 in `zamba2`; the field readers all adapters share are in
`hf_fields`. A new family is one module here plus its row in `FAMILIES` (and its tensor names in
`jmamba.checkpoints.name_map`).

Qwen3.5 as published is a multimodal wrapper (`Qwen3_5ForConditionalGeneration`,
`Qwen3_5MoeForConditionalGeneration`, see `WRAPPERS`): we read its text model, whose config is
nested under `text_config` (see the function `text_config`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path

from jmamba.checkpoints.families.falcon_h1 import falcon_h1
from jmamba.checkpoints.families.hf_fields import HFConfig, _eos_ids
from jmamba.checkpoints.families.ibm import bamba, granite_moe_hybrid
from jmamba.checkpoints.families.mamba2 import mamba2, nemotron_h
from jmamba.checkpoints.families.qwen import qwen3_5, qwen3_5_moe, qwen3_next
from jmamba.checkpoints.families.zamba2 import zamba2
from jmamba.checkpoints.files import read_json
from jmamba.config import ModelConfig

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
# and the vision tower's tensors are skipped (`jmamba.checkpoints.weights.skipped_tensors`). The
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


def _union(first: tuple[int, ...], second: tuple[int, ...]) -> tuple[int, ...]:
    return tuple(dict.fromkeys(first + second))
