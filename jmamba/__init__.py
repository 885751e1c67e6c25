"""jmamba: hybrid state-space language models (Mamba2, NemotronH, Qwen3-Next, Qwen3.5), NNX.

The names below are loaded on first use (PEP 562), so importing a jax-free submodule such as
`jmamba.step.inputs` or `jmamba.config` does not load jax, flax or the Pallas kernels. `LLM`,
`Engine`, `EngineArgs`, `EngineConfig`, `SamplingParams`, `SpeculativeConfig` and `RequestOutput`
are the serving runtime's (`runtime`), offered here for `from jmamba import LLM`.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "NULL": "jmamba.step.pytree",
    "DecodeRows": "jmamba.step.pytree",
    "PrefillRows": "jmamba.step.pytree",
    "StepInputs": "jmamba.step.pytree",
    "Ffn": "jmamba.config",
    "Mixer": "jmamba.config",
    "ModelConfig": "jmamba.config",
    "from_hf_config": "jmamba.checkpoints.families.registry",
    "load_hf_config": "jmamba.checkpoints.families.registry",
    "HybridLM": "jmamba.model",
    "load_pretrained": "jmamba.checkpoints.weights",
    "checkpoint_dtype": "jmamba.checkpoints.weights",
    "prefill_inputs": "jmamba.step.prefill",
    "load_model": "jmamba.loading",
    # The serving runtime's public face, resolved lazily so `from jmamba import LLM` works while
    # jmamba itself never imports runtime (runtime -> jmamba is the only import direction).
    "LLM": "runtime",
    "Engine": "runtime",
    "EngineArgs": "runtime",
    "EngineConfig": "runtime",
    "SamplingParams": "runtime",
    "SpeculativeConfig": "runtime",
    "RequestOutput": "runtime",
}
_SUBMODULES = ("presets",)

__all__ = sorted([*_EXPORTS, *_SUBMODULES])


def __getattr__(name: str) -> Any:
    if name in _SUBMODULES:
        return importlib.import_module(f"jmamba.{name}")
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'jmamba' has no attribute {name!r}")


def __dir__() -> list[str]:
    return __all__
