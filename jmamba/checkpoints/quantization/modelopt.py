"""`quant_method: "modelopt"`: NVIDIA ModelOpt's FP8 checkpoints.

`quant_algo: "FP8"`: each quantized linear holds one `weight_scale` and one calibrated
`input_scale` (scalars); `FP8_PER_CHANNEL_PER_TOKEN`: one `weight_scale` per output channel and
activations quantized per token at run time. `kv_cache_quant_algo: "FP8"` adds the attention
layers' `k_scale` / `v_scale`. The modules kept unquantized are `exclude_modules` (the legacy
`hf_quant_config.json`, whose fields sit under `quantization`) or `ignore` (config.json), as
wildcard patterns. The other algorithms (NVFP4, mixed precision, FP8 block weight-only) are
refused by name.
"""

from __future__ import annotations

from jmamba.checkpoints.quantization.config_fields import QuantConfig, field, names, one_of
from jmamba.checkpoints.quantization.scheme import Fp8Scheme

WHERE = "quantization_config"
_ALGOS = {
    "FP8": ((0, 0), True, "static per tensor"),
    "FP8_PER_CHANNEL_PER_TOKEN": ((1, 0), False, "dynamic per token"),
}


def modelopt_scheme(config: QuantConfig) -> Fp8Scheme:
    """The scheme of a ModelOpt config (config.json's flat form or hf_quant_config.json's
    `quantization` object); ValueError on an algorithm we do not read."""
    where = WHERE
    if isinstance(config.get("quantization"), dict):
        config, where = config["quantization"], f"{WHERE}.quantization"
    algo = str(field(config, "quant_algo", "")).upper()
    if algo not in _ALGOS:
        raise ValueError(
            f"{where}.quant_algo={config.get('quant_algo')!r} is not supported; expected one of "
            f"{sorted(_ALGOS)}"
        )
    block, static, activations = _ALGOS[algo]
    kv = one_of(config, "kv_cache_quant_algo", where, {"FP8", "fp8", None}, None)
    return Fp8Scheme(
        "modelopt",
        block,
        "weight_scale",
        static_inputs=static,
        kv_cache_scales=kv is not None,
        kept=names(config, "exclude_modules", where) + names(config, "ignore", where),
        activations=activations,
    )
