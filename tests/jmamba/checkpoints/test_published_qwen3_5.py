"""Qwen3.5 as published: the multimodal wrappers `Qwen3_5ForConditionalGeneration` and
`Qwen3_5MoeForConditionalGeneration` load as their text model (fixtures `qwen3_5_vl`, tied, and
`qwen3_5_moe_vl`, experts packed; their parity with transformers is in test_parity.py).

The config comes from `text_config`, with the wrapper's own `tie_word_embeddings` and
`eos_token_id` where it sets them (as transformers reads them); the language-model tensors are
under `model.language_model.`; the vision tower (and an MTP head) are skipped with one log line;
every other tensor is still used."""

from __future__ import annotations

import dataclasses
import json
import logging
import shutil
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

from jmamba import checkpoint_dtype, from_hf_config, load_hf_config, load_pretrained
from jmamba.checkpoints.skipped_tensors import unpack_experts
from jmamba.config import Ffn
from tests.jmamba.checkpoints.test_save_pretrained import assert_same_params

FIXTURES = Path(__file__).parents[2] / "fixtures"
WRAPPED = {"qwen3_5_vl": "Qwen3_5ForCausalLM", "qwen3_5_moe_vl": "Qwen3_5MoeForCausalLM"}
NUM_VISION_TENSORS = 33  # model.visual.* of both fixtures (2 blocks, merger, patch and pos embed)


def config_of(family: str) -> dict:
    return json.loads((FIXTURES / family / "config.json").read_text())


def copy_fixture(tmp_path: Path, family: str) -> Path:
    target = tmp_path / family
    shutil.copytree(FIXTURES / family, target, ignore=shutil.ignore_patterns("expected.npz"))
    return target


def write_tensors(target: Path, tensors: dict) -> None:
    save_file(tensors, target / "model.safetensors", metadata={"format": "pt"})


def edit_config(target: Path, edit) -> None:
    config = json.loads((target / "config.json").read_text())
    edit(config)
    (target / "config.json").write_text(json.dumps(config))


@pytest.mark.parametrize("family", sorted(WRAPPED))
def test_the_wrapper_config_is_its_text_models(family):
    """The wrapper's ModelConfig is that of its text model's own class on `text_config` (with the
    wrapper's tie_word_embeddings), but for `architecture`, which names the wrapper."""
    wrapper = config_of(family)
    text = {
        **wrapper["text_config"],
        "architectures": [WRAPPED[family]],
        "tie_word_embeddings": wrapper["tie_word_embeddings"],
    }
    config = from_hf_config(wrapper)
    assert config.architecture == wrapper["architectures"][0]
    assert dataclasses.replace(config, architecture=WRAPPED[family]) == from_hf_config(text)
    assert config.vocab_size == 128 and config.hidden_size == 40
    assert config.max_position_embeddings == 256 and config.eos_token_ids == (2,)
    assert config.ffns == ((Ffn.MOE,) * 3 if "moe" in family else (Ffn.MLP,) * 3)


def test_fields_are_read_at_the_level_transformers_reads_them():
    wrapper = config_of("qwen3_5_vl")  # tied at both levels
    assert from_hf_config(wrapper).tie_word_embeddings
    # transformers ties lm_head by the wrapper's field; text_config's copy does not count then
    untied = {**wrapper, "tie_word_embeddings": False}
    assert not from_hf_config(untied).tie_word_embeddings
    # a config.json without the wrapper's field falls back to text_config's
    del untied["tie_word_embeddings"]
    assert from_hf_config(untied).tie_word_embeddings
    # eos_token_id: the wrapper's first (GenerationConfig.from_model_config), else text_config's
    assert from_hf_config({**wrapper, "eos_token_id": [5, 6]}).eos_token_ids == (5, 6)
    # max_position_embeddings, rope and the rest: text_config's (M-RoPE fields are plain RoPE on
    # text)
    text = {
        **wrapper["text_config"],
        "max_position_embeddings": 262144,
        "rope_parameters": {
            "mrope_interleaved": True,
            "mrope_section": [11, 11, 10],
            "rope_type": "default",
            "rope_theta": 10000000,
            "partial_rotary_factor": 0.25,
        },
    }
    config = from_hf_config({**wrapper, "text_config": text, "max_position_embeddings": 7})
    assert config.max_position_embeddings == 262144
    assert config.attention.rope_theta == 1e7 and config.attention.rotary_dim == 20


def test_generation_config_eos_ids_are_added(tmp_path):
    target = copy_fixture(tmp_path, "qwen3_5_vl")
    (target / "generation_config.json").write_text(json.dumps({"eos_token_id": [7, 2]}))
    assert load_hf_config(target).eos_token_ids == (2, 7)


@pytest.mark.parametrize(
    "edit, message",
    [
        (lambda c: c.pop("text_config"), "config.json of Qwen3_5ForConditionalGeneration has no"),
        (lambda c: c.update(text_config=[1]), "has no 'text_config' object"),
        (
            lambda c: c["text_config"].pop("hidden_size"),
            "the text_config of config.json of Qwen3_5ForConditionalGeneration is missing the "
            "required field 'hidden_size'",
        ),
        (
            lambda c: c["text_config"]["rope_parameters"].update(rope_type="yarn"),
            "rope_type='yarn' is not supported",
        ),
        (
            lambda c: c.update(architectures=["Qwen3_5ForConditionalGeneration", "X"]),
            "architectures=.*not supported; expected one of .*Qwen3_5ForConditionalGeneration",
        ),
    ],
)
def test_bad_wrapper_configs_raise(edit, message):
    config = config_of("qwen3_5_vl")
    edit(config)
    with pytest.raises(ValueError, match=message):
        from_hf_config(config)


@pytest.mark.parametrize("family", sorted(WRAPPED))
def test_vision_tensors_are_skipped_in_one_log_line(caplog, family):
    caplog.set_level(logging.INFO, logger="jmamba.checkpoints.weights")
    load_pretrained(FIXTURES / family)
    arch = config_of(family)["architectures"][0]
    assert [r.getMessage() for r in caplog.records] == [
        f"skipped {NUM_VISION_TENSORS} vision tensors (model.visual.*) of a {arch} checkpoint"
    ]


def test_mtp_tensors_are_skipped_too(tmp_path, caplog):
    """The published checkpoints hold a multi-token-prediction head beside the model (transformers
    skips `mtp.*` too); it is counted in the same line."""
    target = copy_fixture(tmp_path, "qwen3_5_moe_vl")
    tensors = load_file(target / "model.safetensors")
    tensors["mtp.fc.weight"] = np.ones((40, 80), np.float32)
    tensors["mtp.norm.weight"] = np.ones(40, np.float32)
    write_tensors(target, tensors)
    caplog.set_level(logging.INFO, logger="jmamba.checkpoints.weights")
    assert_same_params(load_pretrained(target), load_pretrained(FIXTURES / "qwen3_5_moe_vl"))
    assert caplog.records[0].getMessage() == (
        f"skipped {NUM_VISION_TENSORS} vision tensors (model.visual.*) and 2 "
        "multi-token-prediction tensors (mtp.*) of a Qwen3_5MoeForConditionalGeneration checkpoint"
    )


def test_text_checkpoints_skip_only_mtp(tmp_path, caplog):
    target = copy_fixture(tmp_path, "qwen3_5")
    tensors = load_file(target / "model.safetensors")
    write_tensors(target, {**tensors, "mtp.fc.weight": np.ones((4, 4), np.float32)})
    caplog.set_level(logging.INFO, logger="jmamba.checkpoints.weights")
    assert_same_params(load_pretrained(target), load_pretrained(FIXTURES / "qwen3_5"))
    assert [r.getMessage() for r in caplog.records] == [
        "skipped 1 multi-token-prediction tensor (mtp.*) of a Qwen3_5ForCausalLM checkpoint"
    ]
    # vision tensors are not a text model's: a Qwen3_5ForCausalLM checkpoint must not have them
    write_tensors(target, {**tensors, "model.visual.x": np.ones(3, np.float32)})
    with pytest.raises(ValueError, match=r"unexpected tensors \['model.visual.x'\]"):
        load_pretrained(target)


@pytest.mark.parametrize(
    "change, message",
    [
        (
            lambda t: t.pop("model.language_model.norm.weight"),
            r"missing tensors \['model.language_model.norm.weight'\]",
        ),
        (
            lambda t: t.update({"model.language_model.extra": np.ones(2, np.float32)}),
            r"unexpected tensors \['model.language_model.extra'\]",
        ),
        (  # the text model's own names are not a wrapper's
            lambda t: t.update({"model.norm.weight": np.ones(40, np.float32)}),
            r"unexpected tensors \['model.norm.weight'\]",
        ),
        (
            lambda t: t.update({"visual.merger.x": np.ones(2, np.float32)}),
            r"unexpected tensors \['visual.merger.x'\]",
        ),
    ],
)
def test_every_other_tensor_is_still_used(tmp_path, change, message):
    target = copy_fixture(tmp_path, "qwen3_5_vl")
    tensors = load_file(target / "model.safetensors")
    change(tensors)
    write_tensors(target, tensors)
    with pytest.raises(ValueError, match=message):
        load_pretrained(target)


def test_an_untied_wrapper_needs_its_lm_head(tmp_path):
    target = copy_fixture(tmp_path, "qwen3_5_vl")
    edit_config(target, lambda c: c.update(tie_word_embeddings=False))
    with pytest.raises(ValueError, match=r"missing tensors \['lm_head.weight'\]"):
        load_pretrained(target)


@pytest.mark.parametrize("family", sorted(WRAPPED))
def test_the_language_model_is_the_text_checkpoints(tmp_path, family):
    """The wrapper's text model, rewritten as a checkpoint of its own class (prefix `model.`, no
    vision tower, the config `text_config`), loads to the same parameters."""
    target = tmp_path / family
    target.mkdir()
    wrapper = config_of(family)
    text = {**wrapper["text_config"], "architectures": [WRAPPED[family]]}
    text["tie_word_embeddings"] = wrapper["tie_word_embeddings"]
    (target / "config.json").write_text(json.dumps(text))
    tensors = {
        name.replace("model.language_model.", "model."): tensor
        for name, tensor in load_file(FIXTURES / family / "model.safetensors").items()
        if not name.startswith("model.visual.")
    }
    write_tensors(target, tensors)
    assert_same_params(load_pretrained(target), load_pretrained(FIXTURES / family))


def test_packed_and_per_expert_layouts_load_the_same(tmp_path):
    """`qwen3_5_moe_vl` holds its experts packed, as published; the per-expert tensors that
    transformers' save_pretrained writes give the same parameters, and both at once are refused."""
    target = copy_fixture(tmp_path, "qwen3_5_moe_vl")
    packed = load_file(target / "model.safetensors")
    assert "model.language_model.layers.0.mlp.experts.gate_up_proj" in packed
    per_expert = unpack_experts(packed)
    gate_up = packed["model.language_model.layers.1.mlp.experts.gate_up_proj"]  # [E, 2I, H]
    assert gate_up.shape == (6, 80, 40)
    np.testing.assert_array_equal(
        per_expert["model.language_model.layers.1.mlp.experts.4.up_proj.weight"], gate_up[4, 40:]
    )
    np.testing.assert_array_equal(
        per_expert["model.language_model.layers.1.mlp.experts.4.down_proj.weight"],
        packed["model.language_model.layers.1.mlp.experts.down_proj"][4],
    )
    write_tensors(target, {k: np.ascontiguousarray(v) for k, v in per_expert.items()})
    assert_same_params(load_pretrained(target), load_pretrained(FIXTURES / "qwen3_5_moe_vl"))
    both = {
        **per_expert,
        "model.language_model.layers.2.mlp.experts.down_proj": np.zeros((6, 40, 40), np.float32),
    }
    write_tensors(target, {k: np.ascontiguousarray(v) for k, v in both.items()})
    with pytest.raises(ValueError, match="both packed and one by one"):
        load_pretrained(target)


def test_auto_dtype_ignores_the_skipped_tensors(tmp_path):
    """A bf16 text model beside a large fp32 MTP head is a bf16 checkpoint."""
    target = copy_fixture(tmp_path, "qwen3_5_vl")
    tensors = {
        k: v.astype(ml_dtypes.bfloat16) for k, v in load_file(target / "model.safetensors").items()
    }
    tensors["mtp.fc.weight"] = np.zeros((1024, 1024), np.float32)
    write_tensors(target, tensors)
    assert checkpoint_dtype(target) == "bfloat16"
    assert load_pretrained(target).dtype == np.dtype(ml_dtypes.bfloat16)
