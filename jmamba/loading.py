"""Load a model by name: a checkpoint directory, a built-in preset ("tiny-<name>") or a Hugging Face
hub id ("org/name", through huggingface_hub's cache: `jmamba.checkpoints.hub`), with its tokenizer
when it has one."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from flax import nnx

from jmamba import presets
from jmamba.checkpoints import hub
from jmamba.checkpoints.families.registry import load_hf_config
from jmamba.checkpoints.quantization.fp8_params import with_checkpoint_quantization
from jmamba.checkpoints.weights import (
    QUANTIZATIONS,
    cast,
    load_pretrained,
    on_host,
    resolve_dtype,
)
from jmamba.model import HybridLM
from jmamba.text.tokenizer import byte_tokenizer

PRESET_PREFIX = "tiny-"


def load_model(
    model: str,
    seed: int = 0,
    dtype: str = "auto",
    *,
    host: bool = False,
    quantization: str | None = None,
) -> tuple[HybridLM, Any]:
    """Return (HybridLM, tokenizer or None) for `model`, resolved in this order: an existing local
    directory (a HF checkpoint); a preset ("tiny-<name>"); a Hugging Face hub id ("org/name": its
    config, tokenizer and safetensors files downloaded into huggingface_hub's cache, or found there
    offline, see `jmamba.checkpoints.hub.snapshot`).

    A trained preset loads from its checkpoint directory like any checkpoint; a random-weight
    preset is built from `seed` and gets the presets' byte-level tokenizer. `dtype` is "auto"
    (the checkpoint's; float32 for a random-weight preset), "float32" or "bfloat16". `host`: the
    parameters stay in host memory (numpy), for a runner to place shard by shard.
    `quantization`: None, or "fp8" to quantize a checkpoint's dense projections at load
    (`load_pretrained`; a random-weight preset has no checkpoint to quantize).
    """
    resolve_dtype(dtype)  # a bad name fails before anything loads
    if quantization not in QUANTIZATIONS:
        raise ValueError(f"quantization={quantization!r} must be one of {list(QUANTIZATIONS)}")
    directory = _resolved_directory(model)
    if directory is not None:
        return _load_directory(directory, model, dtype, host, quantization)
    if quantization is not None:
        raise ValueError(
            f"quantization={quantization!r} needs a checkpoint; {model!r} is a random-weight "
            f"preset (trained presets: {[PRESET_PREFIX + n for n in presets.trained_names()]})"
        )
    name = model.removeprefix(PRESET_PREFIX)
    random = cast(HybridLM(presets.tiny(name), rngs=nnx.Rngs(seed)), dtype)
    return (on_host(random) if host else random), _byte_tokenizer()


def _resolved_directory(model: str) -> Path | None:
    """The checkpoint directory `model` names, in `load_model`'s order (a local directory, a
    trained preset's, a hub id's snapshot); None for a random-weight preset; ValueError for a
    name that is none of these."""
    path = Path(model)
    if path.is_dir():
        return path
    if model.startswith(PRESET_PREFIX) and not path.exists():
        name = model.removeprefix(PRESET_PREFIX)
        if name not in presets.names():
            raise ValueError(f"unknown preset {model!r}; built-in presets are {preset_names()}")
        return presets.path(name) if name in presets.trained_names() else None
    if hub.is_hub_id(model) and not path.exists():
        return hub.snapshot(model)
    raise ValueError(
        f"model={model!r} is neither a checkpoint directory nor a preset {preset_names()} nor "
        "a Hugging Face hub id (org/name)"
    )


def load_model_shapes(model_dir: Path, dtype: str = "auto") -> tuple[HybridLM, Any]:
    """(the checkpoint's `HybridLM` as shapes only, in `dtype` as `load_model` resolves it; its
    tokenizer or None): for a runner that reads the parameters shard by shard
    (`runtime.device.placement.CheckpointShards`), so they never sit whole in host memory. Its
    config holds the FP8 plan of that reader (`with_checkpoint_quantization`: the dense FP8
    projections kept in e4m3 where the shards' split keeps their scale blocks whole) and the
    checkpoint's KV-cache scales."""
    cfg = with_checkpoint_quantization(load_hf_config(model_dir), model_dir)
    resolved = resolve_dtype(dtype, model_dir)
    shapes = nnx.eval_shape(lambda: cast(HybridLM(cfg, rngs=nnx.Rngs(0)), resolved))
    return shapes, load_tokenizer(model_dir)


def _load_directory(
    path: Path, model: str, dtype: str, host: bool, quantization: str | None
) -> tuple[HybridLM, Any]:
    if not (path / "config.json").is_file():
        raise ValueError(f"checkpoint directory {model!r} has no config.json")
    if not list(path.glob("*.safetensors")):
        raise ValueError(f"checkpoint directory {model!r} has no *.safetensors files")
    loaded = load_pretrained(path, dtype, host=host, quantization=quantization)
    return loaded, load_tokenizer(path)


def model_tokenizer(model: str) -> Any:
    """The tokenizer `load_model(model)` would return (or None), without loading the model: for a
    process that serves the text while other processes hold the parameters. ValueError for a
    name `load_model` would refuse."""
    directory = _resolved_directory(model)
    return _byte_tokenizer() if directory is None else load_tokenizer(directory)


def preset_names() -> list[str]:
    """The names `load_model` takes for the built-in presets ("tiny-stdlib", ...)."""
    return [PRESET_PREFIX + name for name in presets.names()]


def load_tokenizer(path: Path) -> Any:
    """A `tokenizers.Tokenizer` from `path/tokenizer.json`, or None (no file or no package)."""
    if not (path / "tokenizer.json").is_file():
        return None
    try:
        import tokenizers  # optional: jmamba itself does not need it
    except ImportError:
        return None
    return tokenizers.Tokenizer.from_file(str(path / "tokenizer.json"))


def _byte_tokenizer() -> Any:
    """The presets' byte-level tokenizer, or None without the `tokenizers` package."""
    try:
        return byte_tokenizer()
    except ImportError:
        return None


def checkpoint_dir(model: str) -> Path | None:
    """The directory `load_model(model)` reads: a trained preset's or the given one; None for a
    random-weight preset (it has no files)."""
    if model.startswith(PRESET_PREFIX) and not Path(model).exists():
        name = model.removeprefix(PRESET_PREFIX)
        return presets.path(name) if name in presets.trained_names() else None
    return Path(model)
