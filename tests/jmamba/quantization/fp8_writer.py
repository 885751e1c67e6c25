"""FP8 checkpoints written from the committed float32 fixtures (tests/fixtures/<family>), in the
published layouts, names and scales, with the fp32 weights they stand for computed here in numpy.

Independent of the loader under test: numpy, ml_dtypes and safetensors' writer only. Each linear
weight the format quantizes is rounded to float8_e4m3fn with one scale per block (amax / 448, the
quantizers' rule), and `write_pair` writes both the FP8 checkpoint and a plain fp32 one holding
the dequantized weights (e4m3 value times its block's scale, blocks cut short at the edges), the
reference an FP8 load must reproduce. The modules a published checkpoint keeps in bf16 (embeddings,
`lm_head`, norms, convs, routers, the small GDN a / b projections) stay as they are.
`tests/reference/make_fp8_fixtures.py` writes the same pairs to a directory by hand.
"""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import ml_dtypes
import numpy as np
from safetensors import safe_open
from safetensors.numpy import save_file

FIXTURES = Path(__file__).parents[2] / "fixtures"
E4M3 = ml_dtypes.float8_e4m3fn
E4M3_MAX = 448.0
# Qwen's `modules_to_not_convert`, in spirit: what every format below leaves unquantized.
KEPT = re.compile(
    r".*(embed_tokens|embeddings|lm_head|norm[^.]*|conv1d|\.gate|shared_expert_gate|router\.layer"
    r"|in_proj_a|in_proj_b|in_proj_ba)\.weight"
)
PACKED = re.compile(r"(.+\.experts)\.(\d+)\.(gate_proj|up_proj|down_proj)\.weight")


@dataclasses.dataclass(frozen=True)
class Format:
    """One published FP8 layout: its `quantization_config`, the (rows, cols) of a scale's block
    (0: the whole axis), the scale tensors' suffix and dtype, whether each linear holds an
    `input_scale`, whether the experts are packed ([E, 2I, H] gate_up, [E, H, I] down), and
    whether the attention layers hold KV-cache scales (`kv_scale` each, named by `kv_scale_name`
    from the k / v projection `proj`, its attention `module` and `kind` "k" or "v")."""

    config: dict[str, Any]
    block: tuple[int, int]
    scale_suffix: str
    input_scales: bool = False
    kv_scales: bool = False
    packed_experts: bool = False
    scale_dtype: Any = np.float32
    scale_shape: str = "grid"  # "grid", or "scalar" (ModelOpt's 0-d scales)
    kv_scale: float = 0.02
    kv_scale_name: str = "{proj}.{kind}_scale"  # ModelOpt's (llm-compressor: "{module}...")


def block_fp8(rows: int = 16, cols: int = 16, **kw: Any) -> Format:
    """Qwen's / DeepSeek's fine-grained FP8 (`weight_scale_inv` per rows x cols tile)."""
    config = {
        "quant_method": "fp8",
        "fmt": "e4m3",
        "activation_scheme": "dynamic",
        "weight_block_size": [rows, cols],
        "modules_to_not_convert": ["lm_head", "mlp.gate", "in_proj_a", "in_proj_b"],
    }
    return Format(config, (rows, cols), "weight_scale_inv", **kw)


def compressed_tensors(strategy: str, kv_scale: float | None = None) -> Format:
    """llm-compressor's FP8_DYNAMIC ("channel") or FP8 with dynamic tokens ("tensor"); with
    `kv_scale`, its `kv_cache_scheme` (per-tensor FP8 KV cache: `<attention>.k_scale` and
    `v_scale`, each `kv_scale`)."""
    group = {
        "targets": ["Linear"],
        "weights": {
            "num_bits": 8,
            "type": "float",
            "strategy": strategy,
            "symmetric": True,
            "dynamic": False,
            "observer": "minmax",
        },
        "input_activations": {
            "num_bits": 8,
            "type": "float",
            "strategy": "token",
            "dynamic": True,
            "symmetric": True,
        },
        "output_activations": None,
    }
    config = {
        "quant_method": "compressed-tensors",
        "format": "float-quantized",
        "quantization_status": "compressed",
        "config_groups": {"group_0": group},
        "ignore": ["lm_head", "re:.*mlp.gate$"],
        "kv_cache_scheme": None if kv_scale is None else _KV_CACHE_SCHEME,
    }
    block = (1, 0) if strategy == "channel" else (0, 0)
    if kv_scale is None:
        return Format(config, block, "weight_scale")
    return Format(
        config,
        block,
        "weight_scale",
        kv_scales=True,
        kv_scale=kv_scale,
        kv_scale_name="{module}.{kind}_scale",
    )


_KV_CACHE_SCHEME = {
    "num_bits": 8,
    "type": "float",
    "strategy": "tensor",
    "dynamic": False,
    "symmetric": True,
}


def modelopt(kv_cache: bool = True) -> Format:
    """ModelOpt FP8: per-tensor 0-d `weight_scale` and `input_scale`, KV scales on k / v."""
    config = {
        "quant_method": "modelopt",
        "quant_algo": "FP8",
        "kv_cache_quant_algo": "FP8" if kv_cache else None,
        "ignore": ["lm_head", "*.mixer.gate"],
        "producer": {"name": "modelopt", "version": "0.35.0"},
    }
    return Format(
        config, (0, 0), "weight_scale", input_scales=True, kv_scales=kv_cache, scale_shape="scalar"
    )


def read_fixture(family: str) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    """A committed fixture's config.json and tensors."""
    directory = FIXTURES / family
    config = json.loads((directory / "config.json").read_text())
    with safe_open(str(directory / "model.safetensors"), framework="numpy") as f:
        tensors = {name: f.get_tensor(name) for name in f.keys()}
    return config, tensors


def pack_experts(tensors: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Per-expert tensors packed as transformers holds them: `<p>.experts.gate_up_proj` [E, 2I,
    H] (gate rows first) and `<p>.experts.down_proj` [E, H, I]."""
    out: dict[str, np.ndarray] = {}
    groups: dict[tuple[str, str], dict[int, np.ndarray]] = {}
    for name, tensor in tensors.items():
        match = PACKED.fullmatch(name)
        if match is None:
            out[name] = tensor
        else:
            groups.setdefault((match[1], match[3]), {})[int(match[2])] = tensor
    for prefix in sorted({p for p, _ in groups}):
        gate, up, down = (
            _stack(groups[(prefix, proj)]) for proj in ("gate_proj", "up_proj", "down_proj")
        )
        out[f"{prefix}.gate_up_proj"] = np.concatenate([gate, up], axis=1)
        out[f"{prefix}.down_proj"] = down
    return out


def _stack(by_expert: dict[int, np.ndarray]) -> np.ndarray:
    return np.stack([by_expert[e] for e in sorted(by_expert)])


def _expand(scale: np.ndarray, shape: tuple[int, ...], block: tuple[int, int]) -> np.ndarray:
    """One scale per weight entry: each block's scale repeated over its block, cut to `shape`."""
    for axis, side in zip((-2, -1), block, strict=True):
        scale = np.repeat(scale, side or shape[axis], axis=axis)
    return scale[..., : shape[-2], : shape[-1]]


def _block_amax(weight: np.ndarray, block: tuple[int, int]) -> np.ndarray:
    """max |w| over each block of the last two axes (blocks cut short at the edges)."""
    rows, cols = (side or n for side, n in zip(block, weight.shape[-2:], strict=True))
    starts_r, starts_c = range(0, weight.shape[-2], rows), range(0, weight.shape[-1], cols)
    return np.stack(
        [
            np.stack(
                [np.abs(weight[..., r : r + rows, c : c + cols]).max((-2, -1)) for c in starts_c],
                -1,
            )
            for r in starts_r
        ],
        -2,
    )


def quantize(weight: np.ndarray, fmt: Format) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(e4m3 entries, stored scales, the fp32 weight they stand for) of one weight."""
    amax = _block_amax(weight.astype(np.float32), fmt.block)
    scale = np.where(amax > 0, amax / E4M3_MAX, 1.0).astype(fmt.scale_dtype)
    exact = scale.astype(np.float32)
    full = _expand(exact, weight.shape, fmt.block)
    entries = np.clip(weight / full, -E4M3_MAX, E4M3_MAX).astype(E4M3)
    stored = scale.reshape(()) if fmt.scale_shape == "scalar" else scale
    return entries, stored, entries.astype(np.float32) * full


def _quantized(name: str, tensor: np.ndarray) -> bool:
    if KEPT.fullmatch(name):
        return False
    linear = name.endswith(".weight") and tensor.ndim == 2
    granite_experts = ".block_sparse_moe." in name and tensor.ndim == 3
    return (
        linear or granite_experts or name.endswith((".experts.gate_up_proj", ".experts.down_proj"))
    )


def _scale_name(name: str, suffix: str) -> str:
    if name.endswith(".weight"):
        return f"{name.removesuffix('.weight')}.{suffix}"
    return f"{name}_{suffix.removeprefix('weight_')}"


Tensors = dict[str, np.ndarray]


def write_pair(
    family: str, fmt: Format, root: Path, edit: Callable[[Tensors], Tensors] = dict
) -> tuple[Path, Path]:
    """Write `family`'s fixture in `fmt` to root/fp8 (its tensors passed through `edit` first:
    the refusal tests break them) and its dequantized fp32 twin to root/reference; returns both
    directories."""
    config, tensors = read_fixture(family)
    if fmt.packed_experts:
        tensors = pack_experts(tensors)
    fp8: dict[str, np.ndarray] = {}
    reference: dict[str, np.ndarray] = {}
    for name, tensor in tensors.items():
        if not _quantized(name, tensor):
            fp8[name] = reference[name] = tensor
            continue
        fp8[name], fp8[_scale_name(name, fmt.scale_suffix)], reference[name] = quantize(tensor, fmt)
        if fmt.input_scales:
            fp8[f"{name.removesuffix('.weight')}.input_scale"] = np.asarray(0.05, np.float32)
    if fmt.kv_scales:
        for name in [n for n in tensors if n.endswith((".k_proj.weight", ".v_proj.weight"))]:
            proj = name.removesuffix(".weight")
            module, kind = proj.rsplit(".", 1)[0], proj[-6]
            scale = fmt.kv_scale_name.format(proj=proj, module=module, kind=kind)
            fp8[scale] = np.asarray(fmt.kv_scale, np.float32)
    fp8_dir = _write(root / "fp8", config, fmt.config, edit(fp8))
    return fp8_dir, _write(root / "reference", config, None, reference)


def _write(
    directory: Path,
    config: dict[str, Any],
    quantization: dict[str, Any] | None,
    tensors: dict[str, np.ndarray],
) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    if quantization is not None:
        config = {**config, "quantization_config": quantization}
    (directory / "config.json").write_text(json.dumps(config, indent=2))
    contiguous = {n: np.ascontiguousarray(t) for n, t in tensors.items()}
    save_file(contiguous, directory / "model.safetensors", metadata={"format": "pt"})
    return directory
