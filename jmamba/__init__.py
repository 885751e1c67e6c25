"""jmamba: hybrid state-space language models (Mamba2, NemotronH, Qwen3-Next, Qwen3.5), NNX."""

from jmamba import presets
from jmamba.config import Ffn, Mixer, ModelConfig
from jmamba.families import from_hf_config, load_hf_config
from jmamba.inputs import NULL, DecodeRows, PrefillRows, StepInputs
from jmamba.model import HybridLM
from jmamba.weights import load_pretrained

__all__ = [
    "NULL",
    "DecodeRows",
    "Ffn",
    "HybridLM",
    "Mixer",
    "ModelConfig",
    "PrefillRows",
    "StepInputs",
    "from_hf_config",
    "load_hf_config",
    "load_pretrained",
    "presets",
]
