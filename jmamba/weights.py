"""Load a Hugging Face checkpoint (config.json + safetensors, one file or sharded) into `HybridLM`,
and write one back (`save_pretrained`).

The tensor names are those transformers writes on disk (`save_pretrained` reverts its in-memory
fusions): NemotronH and Mamba2 under `backbone.`, the Qwen3.5 multimodal wrappers' text model under
`model.language_model.`, one tensor per expert, HF linear weights [out, in] (ours are [in, out]).
Packed expert tensors (`experts.gate_up_proj`, `experts.down_proj`: transformers' in-memory
layout, in which the published Qwen3.5 MoE checkpoints are stored) are split into those per-expert
tensors as they are read (`unpack_experts`). The tensors that are not the text model's are skipped
with one log line (`skipped_tensors`: a wrapper's vision tower, Qwen3.5's multi-token-prediction
head), as transformers skips them. Every parameter of the model must be found and every other
tensor of the checkpoint used; otherwise a ValueError lists the missing and unexpected names.
Each parameter's `Source` says how it is built from its tensors and how it splits back into them,
so the writer is the loader's inverse: a model written and read back has the same parameters, bit
for bit. Mamba2 holds A where checkpoints hold A_log = log(-A), which fp32 cannot invert exactly
both ways: a checkpoint read and written back has its tensors bit for bit except such an A_log,
which may move to another value of the same A; an A set other than through `a_from_log`
(training, perturbation) comes back within 2 ulps.

Parameter dtypes (`cast`, `load_pretrained`) follow the parameter's role, see `param_dtype`.
"""

from __future__ import annotations

import json
import logging
import re
import struct
from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from safetensors import SafetensorError
from safetensors.numpy import load_file, save_file

from jmamba.config import Ffn, Mixer, ModelConfig
from jmamba.families import WRAPPERS, from_hf_config, load_hf_config, read_json
from jmamba.layers.fp32_param import Fp32Param
from jmamba.mixers.mamba2 import a_from_log, log_from_a
from jmamba.model import HybridLM

Path_ = tuple[str | int, ...]
logger = logging.getLogger(__name__)

# The checkpoint tensors that are not the text model's, by architecture: (name prefix, what they
# are). Loading skips them and says so in one log line; transformers skips the same ones
# (`_keys_to_ignore_on_load_unexpected` of the Qwen3.5 classes). The published Qwen3.5
# checkpoints hold the multi-token-prediction head (`mtp.*`, for speculative decoding) beside the
# model, and the wrappers a vision tower.
_MTP = ("mtp.", "multi-token-prediction")
_VISION = ("model.visual.", "vision")
SKIPPED: dict[str, tuple[tuple[str, str], ...]] = {
    "Qwen3_5ForCausalLM": (_MTP,),
    "Qwen3_5MoeForCausalLM": (_MTP,),
    "Qwen3_5ForConditionalGeneration": (_VISION, _MTP),
    "Qwen3_5MoeForConditionalGeneration": (_VISION, _MTP),
}

DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16}  # what models may be cast to
# The safetensors dtypes of floating weights -> the parameter dtype `dtype="auto"` picks. float16
# checkpoints load as bfloat16 (the same size, float32's exponent range: no overflow in the
# recurrent states' inputs); float64 ones as float32.
_AUTO = {"F32": "float32", "F64": "float32", "BF16": "bfloat16", "F16": "bfloat16"}


class Source(NamedTuple):
    """The HF tensors of one parameter: `build(*tensors)` is the parameter and `split(param)`
    gives the tensors back, in the order of `names`."""

    names: tuple[str, ...]
    build: Callable[..., np.ndarray]
    split: Callable[[np.ndarray], tuple[np.ndarray, ...]]


def _same(name: str) -> Source:
    return Source((name,), lambda t: t, lambda p: (p,))


def _linear(name: str) -> Source:
    return Source((f"{name}.weight",), lambda t: t.T, lambda p: (p.T,))


def _a_from_log(name: str) -> Source:
    return Source((name,), a_from_log, lambda p: (log_from_a(p),))


def _conv(name: str) -> Source:
    return Source((f"{name}.weight",), lambda t: t[:, 0, :], lambda p: (p[:, None, :],))


def _experts(prefix: str, proj: str, num_experts: int) -> Source:
    names = tuple(f"{prefix}.experts.{e}.{proj}.weight" for e in range(num_experts))
    return Source(names, lambda *ts: np.stack([t.T for t in ts]), lambda p: tuple(e.T for e in p))


def _deinterleave_qwen3_next(qkvz: np.ndarray, ba: np.ndarray, cfg: ModelConfig) -> np.ndarray:
    """Qwen3-Next packs q|k|v|z (and b|a) per key-head group; we use flat [q|k|v|z|b|a]."""
    g = cfg.gdn
    r = g.num_v_heads // g.num_k_heads
    per_group = qkvz.reshape(g.num_k_heads, -1, qkvz.shape[-1])
    q, k, v, z = np.split(
        per_group, np.cumsum([g.head_k_dim, g.head_k_dim, r * g.head_v_dim]), axis=1
    )
    b, a = np.split(ba.reshape(g.num_k_heads, 2 * r, -1), [r], axis=1)
    flat = lambda t: t.reshape(-1, t.shape[-1])  # noqa: E731
    return np.concatenate([flat(t) for t in (q, k, v, z, b, a)]).T


def _interleave_qwen3_next(in_proj: np.ndarray, cfg: ModelConfig) -> tuple[np.ndarray, np.ndarray]:
    """Inverse of `_deinterleave_qwen3_next`: our [in, q|k|v|z|b|a] -> HF (qkvz, ba)."""
    g = cfg.gdn
    sizes = [g.key_dim, g.key_dim, g.value_dim, g.value_dim, g.num_v_heads]
    q, k, v, z, b, a = np.split(in_proj.T, np.cumsum(sizes), axis=0)
    grouped = lambda t: t.reshape(g.num_k_heads, -1, t.shape[-1])  # noqa: E731
    qkvz = np.concatenate([grouped(t) for t in (q, k, v, z)], axis=1)
    ba = np.concatenate([grouped(b), grouped(a)], axis=1)
    return qkvz.reshape(-1, qkvz.shape[-1]), ba.reshape(-1, ba.shape[-1])


def _gdn_in_proj(prefix: str, cfg: ModelConfig) -> Source:
    if cfg.architecture == "Qwen3NextForCausalLM":
        return Source(
            (f"{prefix}.in_proj_qkvz.weight", f"{prefix}.in_proj_ba.weight"),
            lambda qkvz, ba: _deinterleave_qwen3_next(qkvz, ba, cfg),
            lambda p: _interleave_qwen3_next(p, cfg),
        )
    g = cfg.gdn
    names = tuple(f"{prefix}.in_proj_{p}.weight" for p in ("qkv", "z", "b", "a"))
    ends = np.cumsum([g.conv_dim, g.value_dim, g.num_v_heads])
    return Source(
        names, lambda *ts: np.concatenate(ts).T, lambda p: tuple(np.split(p.T, ends, axis=0))
    )


def _mixer_sources(kind: Mixer, hf: str, cfg: ModelConfig) -> dict[Path_, Source]:
    match kind:
        case Mixer.MAMBA2:
            src = {
                ("in_proj", "kernel"): _linear(f"{hf}.in_proj"),
                ("conv_weight",): _conv(f"{hf}.conv1d"),
                ("norm", "weight"): _same(f"{hf}.norm.weight"),
                ("out_proj", "kernel"): _linear(f"{hf}.out_proj"),
            }
            if cfg.mamba2.conv_bias:
                src[("conv_bias",)] = _same(f"{hf}.conv1d.bias")
            src.update({(p,): _same(f"{hf}.{p}") for p in ("dt_bias", "D")})
            src[("A",)] = _a_from_log(f"{hf}.A_log")
            return src
        case Mixer.GDN:
            return {
                ("in_proj", "kernel"): _gdn_in_proj(hf, cfg),
                ("conv_weight",): _conv(f"{hf}.conv1d"),
                ("dt_bias",): _same(f"{hf}.dt_bias"),
                ("A_log",): _same(f"{hf}.A_log"),
                ("norm", "weight"): _same(f"{hf}.norm.weight"),
                ("out_proj", "kernel"): _linear(f"{hf}.out_proj"),
            }
        case Mixer.ATTENTION:
            src = {
                (p, "kernel"): _linear(f"{hf}.{p}")
                for p in ("q_proj", "k_proj", "v_proj", "o_proj")
            }
            if cfg.attention.qk_norm:
                src.update({(n, "weight"): _same(f"{hf}.{n}.weight") for n in ("q_norm", "k_norm")})
            return src
    return {}


def _mlp_sources(hf: str, gated: bool) -> dict[Path_, Source]:
    projs = ("gate_proj", "up_proj", "down_proj") if gated else ("up_proj", "down_proj")
    return {(p, "kernel"): _linear(f"{hf}.{p}") for p in projs}


def _ffn_sources(kind: Ffn, hf: str, cfg: ModelConfig) -> dict[Path_, Source]:
    match kind:
        case Ffn.MLP:
            return _mlp_sources(hf, cfg.mlp.activation == "silu_gated")
        case Ffn.MOE:
            moe = cfg.moe
            gated = moe.activation == "silu_gated"
            src = {("router", "kernel"): _linear(f"{hf}.gate")}
            for proj in (
                ("gate_proj", "up_proj", "down_proj") if gated else ("up_proj", "down_proj")
            ):
                src[(proj,)] = _experts(hf, proj, moe.num_experts)
            shared = "shared_expert" if moe.shared_gate else "shared_experts"
            src.update(
                {("shared", *k): v for k, v in _mlp_sources(f"{hf}.{shared}", gated).items()}
            )
            if moe.shared_gate:
                src[("shared_gate", "kernel")] = _linear(f"{hf}.shared_expert_gate")
            if moe.router == "sigmoid_grouped":
                src[("router_bias",)] = _same(f"{hf}.gate.e_score_correction_bias")
            return src
    return {}


def _model_prefix(cfg: ModelConfig) -> str:
    """Where the text model's tensors are: `model.` (Qwen), `model.language_model.` (in a
    multimodal wrapper), `backbone.` (Mamba2, NemotronH)."""
    if cfg.architecture in ("Mamba2ForCausalLM", "NemotronHForCausalLM"):
        return "backbone."
    return "model.language_model." if cfg.architecture in WRAPPERS else "model."


def _layer_names(cfg: ModelConfig, i: int) -> tuple[str, str, str, str]:
    """HF names of (mixer norm, mixer, ffn norm, ffn) of layer i."""
    if cfg.architecture in ("Mamba2ForCausalLM", "NemotronHForCausalLM"):
        layer = f"backbone.layers.{i}"
        return f"{layer}.norm", f"{layer}.mixer", f"{layer}.norm", f"{layer}.mixer"
    layer = f"{_model_prefix(cfg)}layers.{i}"
    mixer = "self_attn" if cfg.mixers[i] == Mixer.ATTENTION else "linear_attn"
    return (
        f"{layer}.input_layernorm",
        f"{layer}.{mixer}",
        f"{layer}.post_attention_layernorm",
        f"{layer}.mlp",
    )


def tensor_sources(cfg: ModelConfig) -> dict[Path_, Source]:
    """Map every parameter path of `HybridLM(cfg)` to the HF tensors it is built from."""
    if cfg.architecture in ("Mamba2ForCausalLM", "NemotronHForCausalLM"):
        embed, final = "backbone.embeddings.weight", "backbone.norm_f.weight"
    else:
        prefix = _model_prefix(cfg)
        embed, final = f"{prefix}embed_tokens.weight", f"{prefix}norm.weight"
    src: dict[Path_, Source] = {("embed",): _same(embed), ("final_norm", "weight"): _same(final)}
    if not cfg.tie_word_embeddings:
        src[("lm_head", "kernel")] = _linear("lm_head")
    for i, (mixer, ffn) in enumerate(zip(cfg.mixers, cfg.ffns, strict=True)):
        mixer_norm, mixer_hf, ffn_norm, ffn_hf = _layer_names(cfg, i)
        if mixer != Mixer.NONE:
            src[("layers", i, "mixer_norm", "weight")] = _same(f"{mixer_norm}.weight")
            src.update(
                {
                    ("layers", i, "mixer", *k): v
                    for k, v in _mixer_sources(mixer, mixer_hf, cfg).items()
                }
            )
        if ffn != Ffn.NONE:
            src[("layers", i, "ffn_norm", "weight")] = _same(f"{ffn_norm}.weight")
            src.update(
                {("layers", i, "ffn", *k): v for k, v in _ffn_sources(ffn, ffn_hf, cfg).items()}
            )
    return src


def skipped_tensors(architecture: str, names: Any) -> dict[tuple[str, str], list[str]]:
    """The tensors among `names` that a checkpoint of `architecture` holds beside its text model
    (`SKIPPED`), by (prefix, what they are); only groups with tensors appear."""
    groups: dict[tuple[str, str], list[str]] = {}
    for group in SKIPPED.get(architecture, ()):
        found = sorted(n for n in names if n.startswith(group[0]))
        if found:
            groups[group] = found
    return groups


def _skip_message(architecture: str, groups: dict[tuple[str, str], list[str]]) -> str:
    parts = [
        f"{len(names)} {what} tensor{'s' * (len(names) != 1)} ({prefix}*)"
        for (prefix, what), names in groups.items()
    ]
    return f"skipped {' and '.join(parts)} of a {architecture} checkpoint"


_PACKED = re.compile(r"(.+\.experts)\.(gate_up_proj|down_proj)")


def unpack_experts(tensors: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """`tensors` with every packed expert tensor split into the per-expert tensors that
    transformers' `save_pretrained` writes: `<p>.experts.gate_up_proj` [E, 2I, H] into
    `<p>.experts.{e}.gate_proj.weight` (rows :I) and `<p>.experts.{e}.up_proj.weight` (rows I:),
    [I, H] each; `<p>.experts.down_proj` [E, H, I] into `<p>.experts.{e}.down_proj.weight`. The
    packed layout is transformers' in-memory one (`Qwen3_5MoeExperts`), the one in which the
    published Qwen3.5 MoE checkpoints are stored. The parts are views of the packed arrays."""
    out: dict[str, np.ndarray] = {}
    for name, tensor in tensors.items():
        match = _PACKED.fullmatch(name)
        if match is None:
            parts = {name: tensor}
        elif tensor.ndim != 3 or (match[2] == "gate_up_proj" and tensor.shape[1] % 2):
            raise ValueError(f"packed expert tensor {name} has shape {list(tensor.shape)}")
        elif match[2] == "down_proj":
            parts = {f"{match[1]}.{e}.down_proj.weight": t for e, t in enumerate(tensor)}
        else:
            gate, up = np.split(tensor, 2, axis=1)
            parts = {f"{match[1]}.{e}.gate_proj.weight": t for e, t in enumerate(gate)}
            parts.update({f"{match[1]}.{e}.up_proj.weight": t for e, t in enumerate(up)})
        clash = sorted(parts.keys() & out.keys())
        if clash:
            raise ValueError(f"expert tensors both packed and one by one in a checkpoint: {clash}")
        out.update(parts)
    return out


def read_safetensors(model_dir: str | Path) -> dict[str, np.ndarray]:
    """All tensors of `model.safetensors`, or of the shards listed in its `.index.json`."""
    tensors: dict[str, np.ndarray] = {}
    for path in _safetensors_files(Path(model_dir)):
        tensors.update(_load_file(path))
    return tensors


def _safetensors_files(model_dir: Path) -> list[Path]:
    """`model.safetensors`, or the shards its `model.safetensors.index.json` lists."""
    index = model_dir / "model.safetensors.index.json"
    if index.is_file():
        weight_map = read_json(index).get("weight_map")
        if not isinstance(weight_map, dict):
            raise ValueError(f"{index} has no 'weight_map' object")
        files = sorted(set(weight_map.values()))
    elif (model_dir / "model.safetensors").is_file():
        files = ["model.safetensors"]
    else:
        raise ValueError(f"no model.safetensors or model.safetensors.index.json in {model_dir}")
    for name in files:
        if not (model_dir / name).is_file():
            raise ValueError(
                f"checkpoint shard {name} listed in the index is missing in {model_dir}"
            )
    return [model_dir / name for name in files]


def _header(path: Path) -> dict[str, Any]:
    """The JSON header of a safetensors file (8-byte little-endian length, then the JSON)."""
    with path.open("rb") as file:
        try:
            (length,) = struct.unpack("<Q", file.read(8))
            header = json.loads(file.read(length))
        except (struct.error, ValueError, UnicodeDecodeError):
            raise ValueError(f"{path} is not a readable safetensors file") from None
    if not isinstance(header, dict):
        raise ValueError(f"{path} is not a readable safetensors file")
    return header


def _load_file(path: Path) -> dict[str, np.ndarray]:
    try:
        return load_file(path)
    except SafetensorError as error:  # truncated or not a safetensors file at all
        raise ValueError(f"{path} is not a readable safetensors file: {error}") from None


def checkpoint_dtype(model_dir: str | Path) -> str:
    """The parameter dtype `dtype="auto"` gives a checkpoint: that of most of its floating-point
    weights by element count ("float32" or "bfloat16"), read from the safetensors headers alone;
    the tensors that loading skips (`SKIPPED`: a vision tower, an MTP head) do not count.
    """
    counts: dict[str, int] = {}
    config = Path(model_dir) / "config.json"
    archs = (read_json(config).get("architectures") or [""]) if config.is_file() else [""]
    skipped = SKIPPED.get(archs[0], ())
    for path in _safetensors_files(Path(model_dir)):
        for name, entry in _header(path).items():
            if name.startswith(tuple(prefix for prefix, _ in skipped)):
                continue  # not the text model's (a vision tower, an MTP head)
            if name != "__metadata__" and entry.get("dtype") in _AUTO:
                size = int(np.prod(entry.get("shape", [])))
                counts[_AUTO[entry["dtype"]]] = counts.get(_AUTO[entry["dtype"]], 0) + size
    if not counts:
        raise ValueError(f"checkpoint {model_dir} has no floating-point tensors")
    return max(counts, key=counts.__getitem__)


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
    if resolved not in {jnp.dtype(d) for d in DTYPES.values()}:
        raise ValueError(f"dtype={dtype!r} must be one of {['auto', *DTYPES]}")
    return resolved


def param_dtype(variable: nnx.Variable, dtype: jnp.dtype) -> jnp.dtype:
    """The dtype a parameter takes in a model of `dtype`, by its declared role: an `Fp32Param`
    (norm weights; A or A_log, D, dt_bias; conv taps and bias; MoE router kernel and bias) stays
    fp32, every other parameter (the matmul weights: Linear kernels, embedding, lm_head, MoE expert
    stacks) takes `dtype`."""
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


def load_pretrained(model_dir: str | Path, dtype: str | jnp.dtype = "auto") -> HybridLM:
    """Build `HybridLM` from a HF checkpoint directory as a model of `dtype`: "auto" (the
    checkpoint's own, see `checkpoint_dtype`), "float32" or "bfloat16"; each parameter in
    `param_dtype(parameter, dtype)`, as `cast` gives. A multimodal wrapper gives its text model;
    the tensors it skips (`skipped_tensors`) are counted in one `logging` INFO line of this
    module's logger ("skipped 33 vision tensors (model.visual.*) of a ... checkpoint")."""
    cfg = load_hf_config(model_dir)
    dtype = resolve_dtype(dtype, model_dir)
    tensors = read_safetensors(model_dir)
    skipped = skipped_tensors(cfg.architecture, tensors)
    if skipped:
        logger.info(_skip_message(cfg.architecture, skipped))
        for name in (n for names in skipped.values() for n in names):
            del tensors[name]
    tensors = unpack_experts(tensors)
    sources = tensor_sources(cfg)
    graphdef, state = nnx.split(nnx.eval_shape(lambda: HybridLM(cfg, rngs=nnx.Rngs(0))))
    flat = nnx.to_flat_state(state)
    wanted = {name for source in sources.values() for name in source.names}
    missing = sorted(wanted - tensors.keys())
    ignorable = {"lm_head.weight"} if cfg.tie_word_embeddings else set()
    unexpected = sorted(tensors.keys() - wanted - ignorable)
    if missing or unexpected:
        raise ValueError(
            f"checkpoint {model_dir} does not match {cfg.architecture}: "
            f"missing tensors {missing}; unexpected tensors {unexpected}"
        )
    for path, variable in flat:
        names, build, _ = sources[path]
        value = np.asarray(build(*(tensors[n] for n in names)))
        if value.shape != variable.get_value().shape:
            raise ValueError(
                f"tensor(s) {list(names)} give shape {value.shape} for parameter "
                f"{'.'.join(map(str, path))}, expected {variable.get_value().shape}"
            )
        variable.set_value(jnp.asarray(value, dtype=param_dtype(variable, dtype)))
    return nnx.merge(graphdef, nnx.from_flat_state(flat))


def save_pretrained(model: HybridLM, model_dir: str | Path, hf_config: dict[str, Any]) -> None:
    """Write `model` as a HF checkpoint directory: `config.json` (`hf_config`, which must describe
    `model.config`) and `model.safetensors` with transformers' on-disk names, each tensor in its
    parameter's dtype (so a bf16 model writes its fp32 parameters in fp32; A as fp32 A_log).
    `load_pretrained` reads it back to the same parameters, bit for bit (for Mamba2's A: when it
    came from a checkpoint or initialisation, see the module docstring). Experts are written one
    tensor each (as transformers' `save_pretrained` writes them), packed ones included; a
    multimodal wrapper's model is written without the tensors loading skipped (its vision tower).
    """
    if from_hf_config(hf_config) != model.config:
        raise ValueError(
            f"hf_config describes {from_hf_config(hf_config)}, not the model's {model.config}"
        )
    sources = tensor_sources(model.config)
    tensors: dict[str, np.ndarray] = {}
    for path, variable in nnx.to_flat_state(nnx.state(model)):
        source = sources[path]
        parts = source.split(np.asarray(variable.get_value()))
        tensors.update(zip(source.names, map(np.ascontiguousarray, parts), strict=True))
    model_dir = Path(model_dir)
    model_dir.mkdir(parents=True, exist_ok=True)
    (model_dir / "config.json").write_text(json.dumps(hf_config, indent=2, sort_keys=True) + "\n")
    save_file(tensors, model_dir / "model.safetensors", metadata={"format": "pt"})
