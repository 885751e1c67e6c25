"""A checkpoint's `Fp8Scheme` from its `quantization_config`: one parser per `quant_method`
(`FORMATS`), `NO_QUANTIZATION` without one.

The config sits in config.json (at the top, for the multimodal wrappers too), or for ModelOpt's
older exports in `hf_quant_config.json` beside it.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from jmamba.checkpoints.files import read_json
from jmamba.checkpoints.quantization.block_fp8 import block_fp8_scheme
from jmamba.checkpoints.quantization.compressed_tensors import compressed_tensors_scheme
from jmamba.checkpoints.quantization.config_fields import QuantConfig
from jmamba.checkpoints.quantization.modelopt import modelopt_scheme
from jmamba.checkpoints.quantization.scheme import NO_QUANTIZATION, Fp8Scheme

FORMATS: dict[str, Callable[[QuantConfig], Fp8Scheme]] = {
    "fp8": block_fp8_scheme,
    "compressed-tensors": compressed_tensors_scheme,
    "modelopt": modelopt_scheme,
}


def quantization_scheme(config: Any) -> Fp8Scheme:
    """The scheme of a parsed `quantization_config` (None: `NO_QUANTIZATION`); ValueError naming
    an unknown `quant_method` or a form its format does not run."""
    if config is None:
        return NO_QUANTIZATION
    if not isinstance(config, dict):
        raise ValueError(f"quantization_config={config!r} must be an object")
    method = config.get("quant_method")
    if method not in FORMATS:
        raise ValueError(
            f"quantization_config.quant_method={method!r} is not supported; expected one of "
            f"{sorted(FORMATS)}"
        )
    return FORMATS[method](config)


def load_scheme(model_dir: str | Path) -> Fp8Scheme:
    """The scheme of the checkpoint in `model_dir`: config.json's `quantization_config`, else a
    ModelOpt `hf_quant_config.json`, else `NO_QUANTIZATION`."""
    model_dir = Path(model_dir)
    config = model_dir / "config.json"
    found = read_json(config).get("quantization_config") if config.is_file() else None
    legacy = model_dir / "hf_quant_config.json"
    if found is None and legacy.is_file():
        found = {"quant_method": "modelopt", **read_json(legacy)}
    return quantization_scheme(found)
