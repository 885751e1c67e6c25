"""`quant_method: "fp8"`: the fine-grained FP8 of Qwen's and DeepSeek's checkpoints (transformers'
`FineGrainedFP8Config`, vLLM's `Fp8Config`).

With `weight_block_size` [r, c] each weight holds one `weight_scale_inv` per r x c tile (the
name notwithstanding, the weight is its e4m3 entries times it), activations are quantized per
token group at run time (`activation_scheme: "dynamic"`), and `modules_to_not_convert` lists the
modules kept in bf16. Without a block size (AutoFP8's form) the scale is one `weight_scale` per
tensor, with a calibrated `input_scale` when `activation_scheme` is "static"; `ignored_layers`
lists the modules kept.
"""

from __future__ import annotations

from jmamba.checkpoints.quantization.config_fields import QuantConfig, block_size, names, one_of
from jmamba.checkpoints.quantization.scheme import Fp8Scheme

WHERE = "quantization_config"


def block_fp8_scheme(config: QuantConfig) -> Fp8Scheme:
    """The scheme of a `quant_method: "fp8"` config; ValueError on a form we do not read."""
    one_of(config, "fmt", WHERE, {"e4m3"}, "e4m3")
    activations = one_of(config, "activation_scheme", WHERE, {"dynamic", "static"}, "dynamic")
    kept = names(config, "modules_to_not_convert", WHERE) + names(config, "ignored_layers", WHERE)
    if config.get("weight_block_size") is None:
        static = activations == "static"
        return Fp8Scheme(
            "fp8",
            (0, 0),
            "weight_scale",
            static_inputs=static,
            kept=kept,
            activations="static per tensor" if static else "dynamic per token",
        )
    if activations != "dynamic":
        raise ValueError(
            f"{WHERE}.activation_scheme={activations!r} with weight_block_size: block-wise FP8 "
            "quantizes activations dynamically (expected 'dynamic')"
        )
    block = block_size(config["weight_block_size"], f"{WHERE}.weight_block_size")
    return Fp8Scheme(
        "fp8",
        block,
        "weight_scale_inv",
        kept=kept,
        activations=f"dynamic per 1x{block[1]} group",
    )
