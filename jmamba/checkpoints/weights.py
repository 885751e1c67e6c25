"""Load a Hugging Face checkpoint (config.json + safetensors, one file or sharded) into `HybridLM`,
and write one back (`save_pretrained`).

The tensor names are those transformers writes on disk (`save_pretrained` reverts its in-memory
fusions); which tensor makes which parameter is `jmamba.checkpoints.name_map`, what a checkpoint
holds beside the model (a vision tower, an MTP head) or packs (experts) is
`jmamba.checkpoints.skipped_tensors`, and the files are read by `jmamba.checkpoints.files`. Every
parameter of the model must be found and every tensor of the checkpoint but the skipped ones used;
otherwise a ValueError lists the missing and unexpected names. Each parameter's `Source` says how it
is built from its tensors and how it splits back into them, so the writer is the loader's inverse: a
model written and read back has the same parameters, bit for bit. Mamba2 holds A where checkpoints
hold A_log = log(-A), which fp32 cannot invert exactly both ways: a checkpoint read and written back
has its tensors bit for bit except such an A_log, which may move to another value of the same A; an
A set other than through `a_from_log` (training, perturbation) comes back within 2 ulps. The same
holds for a weight with a constant multiplier folded in (`ModelConfig.multipliers`, Falcon-H1's muP
ones): neighbouring fp32 values may fold to one parameter, so such a weight may come back as the
neighbour of the checkpoint's.

Parameter dtypes (`cast`, `load_pretrained`) follow the parameter's role, see `param_dtype`.
"""

from __future__ import annotations

import dataclasses
import json
import logging
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from safetensors.numpy import save_file

from jmamba.checkpoints.families.registry import from_hf_config, load_hf_config
from jmamba.checkpoints.files import checkpoint_dtype, read_safetensors
from jmamba.checkpoints.name_map import tensor_sources
from jmamba.checkpoints.quantization.fp8_params import fp8_load
from jmamba.checkpoints.quantization.registry import load_scheme
from jmamba.checkpoints.skipped_tensors import skip_message, skipped_tensors, unpack_experts
from jmamba.checkpoints.source import Path_, Source, param_path
from jmamba.config import ModelConfig
from jmamba.layers.fp8_linear import Fp8Kernel
from jmamba.layers.fp32_param import Fp32Param
from jmamba.model import HybridLM

logger = logging.getLogger(__name__)

DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16}  # what models may be cast to
QUANTIZATIONS = (None, "fp8")  # load_pretrained's `quantization`


def resolve_dtype(dtype: str | jnp.dtype, model_dir: str | Path | None = None) -> jnp.dtype:
    """`dtype` as a jnp dtype: "auto" (the checkpoint's, float32 without one), "float32",
    "bfloat16" or one of those dtypes."""
    if isinstance(dtype, str):
        if dtype == "auto":
            dtype = checkpoint_dtype(model_dir) if model_dir is not None else "float32"
        if dtype not in DTYPES:
            raise ValueError(f"dtype={dtype!r} must be one of {['auto', *DTYPES]}")
        return jnp.dtype(DTYPES[dtype])
    try:
        resolved = jnp.dtype(dtype)
    except TypeError:
        resolved = None
    if resolved is None or resolved not in {jnp.dtype(d) for d in DTYPES.values()}:
        raise ValueError(f"dtype={dtype!r} must be one of {['auto', *DTYPES]}")
    return resolved


def param_dtype(variable: nnx.Variable, dtype: jnp.dtype) -> jnp.dtype:
    """The dtype a parameter takes in a model of `dtype`, by its declared role: an `Fp32Param`
    (norm weights; A or A_log, D, dt_bias; conv taps and bias; MoE router kernel and bias) stays
    fp32, an `Fp8Kernel` (an `Fp8Linear`'s) stays e4m3, every other parameter (the matmul weights:
    Linear kernels, embedding, lm_head, MoE expert stacks) takes `dtype`."""
    if isinstance(variable, Fp8Kernel):
        return jnp.dtype(jnp.float8_e4m3fn)
    return jnp.dtype(jnp.float32) if isinstance(variable, Fp32Param) else dtype


def cast(model: HybridLM, dtype: str | jnp.dtype) -> HybridLM:
    """`model` as a model of `dtype` (a new module; "auto" is float32): each parameter in
    `param_dtype(parameter, dtype)`, so a bfloat16 model has bf16 matmul weights and keeps the
    parameters of fp32 math in fp32 (its step converts none of them); `model.dtype` is `dtype`."""
    dtype = resolve_dtype(dtype)
    graphdef, state = nnx.split(model)

    def to_dtype(variable: nnx.Variable) -> nnx.Variable:
        return variable.replace(variable.get_value().astype(param_dtype(variable, dtype)))

    is_variable = lambda x: isinstance(x, nnx.Variable)  # noqa: E731
    return nnx.merge(graphdef, jax.tree.map(to_dtype, state, is_leaf=is_variable))


def load_pretrained(
    model_dir: str | Path,
    dtype: str | jnp.dtype = "auto",
    *,
    host: bool = False,
    quantization: str | None = None,
) -> HybridLM:
    """Build `HybridLM` from a HF checkpoint directory as a model of `dtype`: "auto" (the
    checkpoint's own, see `checkpoint_dtype`), "float32" or "bfloat16"; each parameter in
    `param_dtype(parameter, dtype)`, as `cast` gives. `host`: the parameters stay numpy arrays in
    host memory, never on a device (a runner then places each tensor-parallel shard of them on its
    own device: `runtime.device.placement`). A multimodal wrapper gives its text model;
    the tensors it skips (`skipped_tensors`) are counted in one `logging` INFO line of this
    module's logger ("skipped 33 vision tensors (model.visual.*) of a ... checkpoint"). An FP8
    checkpoint (`jmamba.checkpoints.quantization`: its `quantization_config`) keeps the FP8
    weights of its dense projections in e4m3 with their scales (`Fp8Linear`s, the plan in
    `model.config.quantization`, `jmamba.checkpoints.quantization.fp8_params`) and loads its
    other FP8 weights dequantized to fp32, then cast to `dtype`. `quantization="fp8"` quantizes a
    checkpoint without FP8 weights at load, the same projections per output channel (an FP8
    checkpoint keeps its own); None loads the checkpoint as it is."""
    if quantization not in QUANTIZATIONS:
        raise ValueError(f"quantization={quantization!r} must be one of {list(QUANTIZATIONS)}")
    cfg = load_hf_config(model_dir)
    dtype = resolve_dtype(dtype, model_dir)
    tensors, plan, sources = fp8_load(
        cfg,
        load_scheme(model_dir),
        read_safetensors(model_dir),
        tensor_sources(cfg),
        dynamic=quantization == "fp8",
    )
    cfg = dataclasses.replace(cfg, quantization=plan)
    skipped = skipped_tensors(cfg.architecture, tensors, has_mtp=cfg.has_mtp)
    if skipped:
        logger.info(skip_message(cfg.architecture, skipped))
        for name in (n for names in skipped.values() for n in names):
            del tensors[name]
    tensors = unpack_experts(tensors)
    graphdef, state = nnx.split(nnx.eval_shape(lambda: HybridLM(cfg, rngs=nnx.Rngs(0))))
    flat = nnx.to_flat_state(state)
    check_tensor_names(cfg, sources, tensors.keys(), model_dir)
    for path, variable in flat:
        source = sources[param_path(path)]
        names, build = source.names, source.build
        value = np.asarray(build(*(tensors[n] for n in names)))
        if value.shape != variable.get_value().shape:
            raise ValueError(
                f"tensor(s) {list(names)} give shape {value.shape} for parameter "
                f"{'.'.join(map(str, path))}, expected {variable.get_value().shape}"
            )
        as_array = np.asarray if host else jnp.asarray
        variable.set_value(as_array(value, dtype=param_dtype(variable, dtype)))
    return nnx.merge(graphdef, nnx.from_flat_state(flat))


def check_tensor_names(
    cfg: ModelConfig, sources: dict[Path_, Source], names: Iterable[str], model_dir: str | Path
) -> None:
    """ValueError listing the missing and unexpected tensors unless `names` (the checkpoint's,
    the skipped ones left out) are exactly those `sources` read (a tied model may hold an
    unused lm_head)."""
    names = set(names)
    wanted = {name for source in sources.values() for name in source.names}
    missing = sorted(wanted - names)
    ignorable = {"lm_head.weight"} if cfg.tie_word_embeddings else set()
    unexpected = sorted(names - wanted - ignorable)
    if missing or unexpected:
        raise ValueError(
            f"checkpoint {model_dir} does not match {cfg.architecture}: "
            f"missing tensors {missing}; unexpected tensors {unexpected}"
        )


def on_host(model: HybridLM) -> HybridLM:
    """`model` with its parameters copied to host memory (numpy), as `load_pretrained(host=True)`
    gives them."""
    graphdef, state = nnx.split(model)
    return nnx.merge(graphdef, jax.device_get(state))


def save_pretrained(model: HybridLM, model_dir: str | Path, hf_config: dict[str, Any]) -> None:
    """Write `model` as a HF checkpoint directory: `config.json` (`hf_config`, which must describe
    `model.config`) and `model.safetensors` with transformers' on-disk names, each tensor in its
    parameter's dtype (so a bf16 model writes its fp32 parameters in fp32; A as fp32 A_log).
    `load_pretrained` reads it back to the same parameters, bit for bit (for Mamba2's A: when it
    came from a checkpoint or initialisation, see the module docstring). Experts are written one
    tensor each (as transformers' `save_pretrained` writes them), packed ones included; a
    multimodal wrapper's model is written without the tensors loading skipped (its vision tower).
    Zamba2's shared blocks, copied into each use site with its adapter folded in, are written
    once (`jmamba.mixers.transformer_mamba2` says what comes back).
    """
    if from_hf_config(hf_config) != model.config:
        raise ValueError(
            f"hf_config describes {from_hf_config(hf_config)}, not the model's {model.config}"
        )
    sources = tensor_sources(model.config)
    values = {
        param_path(p): np.asarray(v.get_value()) for p, v in nnx.to_flat_state(nnx.state(model))
    }
    tensors: dict[str, np.ndarray] = {}
    pieces: dict[str, dict[int, np.ndarray]] = {}
    for path, value in values.items():
        source = sources[path]
        parts = source.split(value, *(values[p] for p in source.joint))
        for name, part in zip(source.names, parts, strict=True):
            if source.piece is None:  # a tensor several parameters copy: the first one's
                tensors.setdefault(name, np.ascontiguousarray(part))
            else:
                pieces.setdefault(name, {})[source.piece[1]] = part
    axes = {n: s.piece[0] for s in sources.values() if s.piece is not None for n in s.names}
    for name, by_index in pieces.items():  # concatenate may keep the pieces' Fortran order
        joined = np.concatenate([by_index[i] for i in sorted(by_index)], axis=axes[name])
        tensors[name] = np.ascontiguousarray(joined)
    model_dir = Path(model_dir)
    model_dir.mkdir(parents=True, exist_ok=True)
    (model_dir / "config.json").write_text(json.dumps(hf_config, indent=2, sort_keys=True) + "\n")
    save_file(tensors, model_dir / "model.safetensors", metadata={"format": "pt"})
