"""Reading a checkpoint's files: its JSON files, one `model.safetensors` or the shards its
`model.safetensors.index.json` lists, with errors naming the file, and the dtype most of the
stored weights have (read from the headers alone, the skipped tensors left out).

float8 tensors (FP8 checkpoints, `jmamba.checkpoints.quantization`) are read by memory map as
`ml_dtypes` arrays: safetensors' numpy reader has no float8 dtype.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Any

import ml_dtypes
import numpy as np
from safetensors import SafetensorError, safe_open

from jmamba.checkpoints.skipped_tensors import MTP, SKIPPED

# The safetensors dtypes of floating weights -> the parameter dtype `dtype="auto"` picks. float16
# checkpoints load as bfloat16 (the same size, float32's exponent range: no overflow in the
# recurrent states' inputs); float64 ones as float32.
# float8 weights do not count: an FP8 checkpoint loads in the dtype of its unquantized weights.
_AUTO = {"F32": "float32", "F64": "float32", "BF16": "bfloat16", "F16": "bfloat16"}
# The safetensors dtypes of float8 tensors -> their numpy dtypes.
FLOAT8 = {"F8_E4M3": np.dtype(ml_dtypes.float8_e4m3fn), "F8_E5M2": np.dtype(ml_dtypes.float8_e5m2)}


def read_json(path: Path) -> dict[str, Any]:
    """A JSON object from `path`; ValueError naming the file if it is not one."""
    try:
        value = json.loads(path.read_bytes())
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise ValueError(f"{path} is not valid JSON: {error}") from None
    if not isinstance(value, dict):
        raise ValueError(f"{path} must hold a JSON object, not a {type(value).__name__}")
    return value


def read_safetensors(model_dir: str | Path) -> dict[str, np.ndarray]:
    """All tensors of `model.safetensors`, or of the shards listed in its `.index.json`."""
    tensors: dict[str, np.ndarray] = {}
    for path in safetensors_files(Path(model_dir)):
        tensors.update(_load_file(path))
    return tensors


def safetensors_files(model_dir: Path) -> list[Path]:
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
        with safe_open(str(path), framework="numpy") as handle:
            float8 = float8_tensors(path)
            tensors = {n: handle.get_tensor(n) for n in handle.keys() if n not in float8}
    except SafetensorError as error:  # truncated or not a safetensors file at all
        raise ValueError(f"{path} is not a readable safetensors file: {error}") from None
    return tensors | {name: read_float8(path, *entry) for name, entry in float8.items()}


Float8Entry = tuple[np.dtype, tuple[int, ...], int]  # dtype, shape, first byte in the file


def float8_tensors(path: Path) -> dict[str, Float8Entry]:
    """The float8 tensors of a safetensors file, by name: their dtype, shape and first byte."""
    with path.open("rb") as file:
        (length,) = struct.unpack("<Q", file.read(8))
    data = 8 + length  # tensors' offsets count from the end of the header
    return {
        name: (FLOAT8[entry["dtype"]], tuple(entry["shape"]), data + entry["data_offsets"][0])
        for name, entry in _header(path).items()
        if name != "__metadata__" and entry.get("dtype") in FLOAT8
    }


def read_float8(
    path: Path, dtype: np.dtype, shape: tuple[int, ...], start: int, index: tuple[slice, ...] = ()
) -> np.ndarray:
    """A float8 tensor of `float8_tensors(path)`, or its slice `index`, read by memory map (only
    the pages of the slice are read)."""
    if not all(shape):
        return np.zeros(shape, dtype)[index]
    mapped = np.memmap(path, np.uint8, "r", offset=start, shape=shape)
    return np.array(mapped[index]).view(dtype)


def checkpoint_dtype(model_dir: str | Path) -> str:
    """The parameter dtype `dtype="auto"` gives a checkpoint: that of most of its floating-point
    weights by element count ("float32" or "bfloat16"), read from the safetensors headers alone;
    the tensors of a vision tower or an MTP head (`SKIPPED`, `MTP`) do not count.
    """
    counts: dict[str, int] = {}
    config = Path(model_dir) / "config.json"
    archs = (read_json(config).get("architectures") or [""]) if config.is_file() else [""]
    skipped = tuple(prefix for prefix, _ in (*SKIPPED.get(archs[0], ()), MTP))
    for path in safetensors_files(Path(model_dir)):
        for name, entry in _header(path).items():
            if name.startswith(skipped):
                continue  # not the text model's (a vision tower, an MTP head)
            if name != "__metadata__" and entry.get("dtype") in _AUTO:
                size = int(np.prod(entry.get("shape", [])))
                counts[_AUTO[entry["dtype"]]] = counts.get(_AUTO[entry["dtype"]], 0) + size
    if not counts:
        raise ValueError(f"checkpoint {model_dir} has no floating-point tensors")
    return max(counts, key=counts.__getitem__)
