"""`quantization_config` -> `Fp8Scheme` for each published FP8 format, and the refusals of every
form we do not run (a ValueError naming the field)."""

from __future__ import annotations

import copy
import json
import re
from typing import Any

import pytest

from jmamba.checkpoints.quantization.registry import load_scheme, quantization_scheme
from jmamba.checkpoints.quantization.scheme import NO_QUANTIZATION, Fp8Scheme
from tests.jmamba.quantization.fp8_writer import block_fp8, compressed_tensors, modelopt

# Qwen3-Next-80B-A3B-Instruct-FP8's quantization_config, its kept list shortened.
QWEN_FP8 = {
    "activation_scheme": "dynamic",
    "fmt": "e4m3",
    "quant_method": "fp8",
    "weight_block_size": [128, 128],
    "modules_to_not_convert": ["lm_head", "model.layers.0.linear_attn.in_proj_ba"],
}


def test_block_fp8_as_qwen_publishes_it():
    scheme = quantization_scheme(QWEN_FP8)
    assert scheme == Fp8Scheme(
        "fp8",
        (128, 128),
        "weight_scale_inv",
        kept=("lm_head", "model.layers.0.linear_attn.in_proj_ba"),
        activations="dynamic per 1x128 group",
    )
    assert scheme.scale_name("a.b.weight") == "a.b.weight_scale_inv"
    assert scheme.scale_name("m.experts.gate_up_proj") == "m.experts.gate_up_proj_scale_inv"
    assert scheme.describe() == (
        "fp8 e4m3 weights per 128x128 block, dynamic per 1x128 group activations"
    )


def test_per_tensor_fp8_with_static_activations():
    scheme = quantization_scheme(
        {"quant_method": "fp8", "activation_scheme": "static", "ignored_layers": ["lm_head"]}
    )
    assert (scheme.block, scheme.scale_suffix, scheme.static_inputs) == (
        (0, 0),
        "weight_scale",
        True,
    )
    assert scheme.input_scale_name("x.q_proj.weight") == "x.q_proj.input_scale"
    assert scheme.kept == ("lm_head",)
    assert scheme.describe() == "fp8 e4m3 weights per tensor, static per tensor activations"


@pytest.mark.parametrize(("strategy", "block"), [("channel", (1, 0)), ("tensor", (0, 0))])
def test_compressed_tensors_strategies(strategy, block):
    scheme = quantization_scheme(compressed_tensors(strategy).config)
    assert scheme == Fp8Scheme(
        "compressed-tensors", block, "weight_scale", kept=("lm_head", "re:.*mlp.gate$")
    )
    assert scheme.describe().startswith(f"compressed-tensors e4m3 weights per {strategy},")


def test_compressed_tensors_block_weight_only_with_kv_scales():
    config = copy.deepcopy(compressed_tensors("channel").config)
    group = config["config_groups"]["group_0"]
    group["weights"].update(strategy="block", block_structure=[128, 64])
    group["input_activations"] = None
    config["kv_cache_scheme"] = {"num_bits": 8, "type": "float", "strategy": "tensor"}
    scheme = quantization_scheme(config)
    assert (scheme.block, scheme.kv_cache_scales, scheme.static_inputs) == ((128, 64), True, False)
    assert scheme.activations == "none (weight-only)"


def test_compressed_tensors_static_activations():
    config = copy.deepcopy(compressed_tensors("tensor").config)
    config["config_groups"]["group_0"]["input_activations"].update(dynamic=False, strategy="tensor")
    assert quantization_scheme(config).static_inputs


def test_modelopt_in_config_json_and_in_hf_quant_config(tmp_path):
    scheme = quantization_scheme(modelopt().config)
    assert scheme == Fp8Scheme(
        "modelopt",
        (0, 0),
        "weight_scale",
        static_inputs=True,
        kv_cache_scales=True,
        kept=("lm_head", "*.mixer.gate"),
        activations="static per tensor",
    )
    legacy = {
        "producer": {"name": "modelopt", "version": "0.19.0"},
        "quantization": {
            "quant_algo": "FP8_PER_CHANNEL_PER_TOKEN",
            "kv_cache_quant_algo": None,
            "exclude_modules": ["lm_head"],
        },
    }
    (tmp_path / "config.json").write_text(json.dumps({"architectures": ["Mamba2ForCausalLM"]}))
    (tmp_path / "hf_quant_config.json").write_text(json.dumps(legacy))
    scheme = load_scheme(tmp_path)
    assert (scheme.method, scheme.block, scheme.static_inputs) == ("modelopt", (1, 0), False)
    assert scheme.kept == ("lm_head",)


def test_no_quantization_config(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"architectures": ["Mamba2ForCausalLM"]}))
    assert load_scheme(tmp_path) is NO_QUANTIZATION
    assert not NO_QUANTIZATION.quantized and NO_QUANTIZATION.describe() == "unquantized"


def _edited(config: dict[str, Any], path: tuple[str, ...], value: Any) -> dict[str, Any]:
    config = copy.deepcopy(config)
    inner = config
    for key in path[:-1]:
        inner = inner[key]
    inner[path[-1]] = value
    return config


_CT = compressed_tensors("channel").config
_GROUP = ("config_groups", "group_0")
REFUSED = {
    "unknown method": (QWEN_FP8, ("quant_method",), "gptq", "quant_method='gptq'"),
    "bitsandbytes": (QWEN_FP8, ("quant_method",), "bitsandbytes", "quant_method"),
    "e5m2": (QWEN_FP8, ("fmt",), "e5m2", "fmt='e5m2'"),
    "block of one side": (QWEN_FP8, ("weight_block_size",), [128], "weight_block_size"),
    "block of zero": (QWEN_FP8, ("weight_block_size",), [0, 128], "weight_block_size"),
    "static with blocks": (QWEN_FP8, ("activation_scheme",), "static", "activation_scheme"),
    "ct int4 packed": (_CT, ("format",), "pack-quantized", "format='pack-quantized'"),
    "ct int8": (_CT, (*_GROUP, "weights", "type"), "int", "weights.type='int'"),
    "ct 4 bits": (_CT, (*_GROUP, "weights", "num_bits"), 4, "weights.num_bits=4"),
    "ct groups": (_CT, (*_GROUP, "weights", "strategy"), "group", "weights.strategy='group'"),
    "ct asymmetric": (_CT, (*_GROUP, "weights", "symmetric"), False, "weights.symmetric"),
    "ct outputs": (_CT, (*_GROUP, "output_activations"), {"num_bits": 8}, "output_activations"),
    "ct mixed groups": (
        _CT,
        ("config_groups", "group_1"),
        {
            "targets": ["re:.*down_proj"],
            "weights": {**_CT["config_groups"]["group_0"]["weights"], "strategy": "tensor"},
        },
        "2 different ways",
    ),
    "modelopt nvfp4": (modelopt().config, ("quant_algo",), "NVFP4", "quant_algo='NVFP4'"),
    "modelopt block wo": (modelopt().config, ("quant_algo",), "FP8_PB_WO", "quant_algo"),
}


@pytest.mark.parametrize("case", sorted(REFUSED))
def test_refusals_name_the_field(case):
    config, path, value, message = REFUSED[case]
    with pytest.raises(ValueError, match=re.escape(message)):
        quantization_scheme(_edited(config, path, value))


def test_the_writer_formats_parse():
    """The test fixtures' configs are ones the registry reads (the loading tests rely on it)."""
    for fmt in (block_fp8(), compressed_tensors("channel"), modelopt(kv_cache=False)):
        assert quantization_scheme(fmt.config).quantized
