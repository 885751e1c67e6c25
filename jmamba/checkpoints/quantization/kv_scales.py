"""The KV-cache scales of an FP8 checkpoint's attention layers: one `k_scale` and one `v_scale`
per layer, which an FP8 KV cache stores keys and values divided by (clipped to e4m3's +-448) and
reads them back multiplied by (vLLM's `--kv-cache-dtype fp8` with a calibrated checkpoint).

A checkpoint declares them (`Fp8Scheme.kv_cache_scales`: compressed-tensors' `kv_cache_scheme`,
ModelOpt's `kv_cache_quant_algo`) and holds them under the names vLLM reads
(`maybe_remap_kv_scale_name`, compressed-tensors' `get_cache_scale`), for an attention module
`<p>` (`model.layers.3.self_attn`):

- `<p>.k_scale` / `<p>.v_scale`: llm-compressor's;
- `<p>.k_proj.k_scale` / `<p>.v_proj.v_scale`: ModelOpt's;
- `<p>.k_proj.output_scale` / `<p>.v_proj.output_scale`: older compressed-tensors exports;
- `<p>.kv_scale`: the deprecated single scale, used for both.

As vLLM does, a layer with only one of the two uses it for both, and a layer with neither keeps
1.0. A scale must be one positive finite number (per-head scales, compressed-tensors'
`attn_head` strategy, are refused by name). The scales are static floats of the model
(`Fp8Plan.kv_scales`), read from the tensors of the attention modules the name map knows.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Collection, Mapping
from pathlib import Path

import ml_dtypes  # noqa: F401  (registers bfloat16 with numpy, for safetensors' numpy reader)
import numpy as np
from safetensors import safe_open

from jmamba.checkpoints.files import safetensors_files
from jmamba.checkpoints.quantization.scheme import Fp8Scheme
from jmamba.checkpoints.source import Source
from jmamba.fp8_plan import KvScales, Path_

# Per cache ("k", "v"): the names of its scale under an attention module, in the order read.
SCALE_SUFFIXES = {
    "k": (".k_scale", ".k_proj.k_scale", ".k_proj.output_scale", ".kv_scale"),
    "v": (".v_scale", ".v_proj.v_scale", ".v_proj.output_scale", ".kv_scale"),
}
# Every name a KV-cache scale may end with (the tensors a scheme with KV scales consumes).
KV_SCALE_ENDINGS = (".k_scale", ".v_scale", ".kv_scale", "_proj.output_scale")
_K_PROJ = (".k_proj.weight",)


def attention_prefixes(sources: Mapping[Path_, Source]) -> dict[Path_, str]:
    """The module path of each attention layer -> its checkpoint prefix (`<p>` of
    `<p>.k_proj.weight`, the first tensor of its k_proj kernel)."""
    out: dict[Path_, str] = {}
    for path, source in sources.items():
        if path[-2:] == ("k_proj", "kernel") and source.names[0].endswith(_K_PROJ):
            out[path[:-2]] = source.names[0].removesuffix(_K_PROJ[0])
    return out


def _scalar(name: str, value: np.ndarray) -> float:
    """The one positive finite number a scale tensor holds; ValueError naming it otherwise."""
    value = np.asarray(value, np.float32)
    if value.size != 1:
        raise ValueError(
            f"KV-cache scale {name} has shape {list(value.shape)}: one scale per layer is read "
            "(per-head KV-cache scales are not supported)"
        )
    scale = float(value.reshape(()))
    if not (math.isfinite(scale) and scale > 0):
        raise ValueError(f"KV-cache scale {name} is {scale}; it must be positive and finite")
    return scale


def _layer_scales(
    prefix: str, names: Collection[str], read: Callable[[str], np.ndarray]
) -> tuple[float, float] | None:
    """(k_scale, v_scale) of the attention module `prefix`, or None when it holds neither."""
    found: dict[str, float] = {}
    for kind, suffixes in SCALE_SUFFIXES.items():
        name = next((prefix + s for s in suffixes if prefix + s in names), None)
        if name is not None:
            found[kind] = _scalar(name, read(name))
    if not found:
        return None
    either = next(iter(found.values()))
    return found.get("k", either), found.get("v", either)


def kv_scales(
    scheme: Fp8Scheme,
    sources: Mapping[Path_, Source],
    names: Collection[str],
    read: Callable[[str], np.ndarray],
) -> KvScales:
    """(module path, k_scale, v_scale) of each attention layer with scales among `names` (a
    checkpoint's tensor names; `read` gives a tensor by name), none unless `scheme` declares
    them."""
    if not scheme.kv_cache_scales:
        return ()
    out = []
    for path, prefix in sorted(attention_prefixes(sources).items(), key=str):
        scales = _layer_scales(prefix, names, read)
        if scales is not None:
            out.append((path, *scales))
    return tuple(out)


def read_kv_scales(
    model_dir: str | Path, scheme: Fp8Scheme, sources: Mapping[Path_, Source]
) -> KvScales:
    """`kv_scales` of the checkpoint in `model_dir`, reading the scale tensors alone."""
    if not scheme.kv_cache_scales:
        return ()
    tensors: dict[str, np.ndarray] = {}
    for path in safetensors_files(Path(model_dir)):
        with safe_open(str(path), framework="numpy") as handle:
            for name in handle.keys():
                if name.endswith(KV_SCALE_ENDINGS):
                    tensors[name] = handle.get_tensor(name)
    return kv_scales(scheme, sources, tensors.keys(), tensors.__getitem__)
