"""`TensorReader`: a checkpoint's tensors read by name and slice, never whole unless asked
(safetensors' `safe_open(...).get_slice(name)[...]`), for a loader that reads each
tensor-parallel shard's slice alone (`jmamba.checkpoints.shards`).

Packed expert tensors (`<p>.experts.gate_up_proj` [E, 2I, H], `<p>.experts.down_proj` [E, H, I], see
`jmamba.checkpoints.skipped_tensors.unpack_experts`) are read under the per-expert names the name
map expects: expert e's gate is rows [0, I) of packed[e], so a slice of it is a slice of the file.
FP8 weights (`jmamba.checkpoints.quantization`) are read dequantized to fp32, a slice with the
scales of its blocks, and their scale tensors are no names of the reader, but for the weights
`keep_stored` names: those are read as stored (e4m3 entries), beside their scale tensors.
`elements_read` counts what was read, for tests that check a loader read slices only.
"""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any, NamedTuple

import ml_dtypes  # noqa: F401  (registers bfloat16 with numpy, for safetensors' numpy reader)
import numpy as np
from safetensors import safe_open

from jmamba.checkpoints.files import Float8Entry, float8_tensors, read_float8, safetensors_files
from jmamba.checkpoints.quantization.dequantization import dequantize, scale_grid
from jmamba.checkpoints.quantization.quantized_tensors import QuantizedTensors, find_quantized
from jmamba.checkpoints.quantization.registry import load_scheme
from jmamba.checkpoints.skipped_tensors import PACKED_EXPERTS

Index = tuple[slice, ...]


class _Entry(NamedTuple):
    """Where a name's tensor lies: file `path`, stored tensor `stored`, and for a packed expert
    the expert `expert` and its first row `row` (else None, 0)."""

    path: Path
    stored: str
    shape: tuple[int, ...]
    expert: int | None = None
    row: int = 0


class TensorReader:
    """The tensors of `model_dir`'s safetensors files by name, read slice by slice (a context
    manager: the files stay open inside `with`)."""

    def __init__(self, model_dir: str | Path) -> None:
        self._stack = contextlib.ExitStack()
        self._files: dict[Path, Any] = {}
        self._entries: dict[str, _Entry] = {}
        self._float8: dict[str, Float8Entry] = {}
        self._grids: dict[str, np.ndarray] = {}
        self.elements_read = 0
        self._shapes: dict[str, tuple[int, ...]] = {}  # the stored tensors'
        for path in safetensors_files(Path(model_dir)):
            handle = self._stack.enter_context(safe_open(str(path), framework="numpy"))
            self._files[path] = handle
            self._float8.update(float8_tensors(path))
            for name in handle.keys():
                self._shapes[name] = tuple(handle.get_slice(name).get_shape())
                self._add(name, _Entry(path, name, self._shapes[name]))
        float8 = {name: entry[0] for name, entry in self._float8.items()}
        self._quantized = find_quantized(load_scheme(model_dir), self._shapes, float8)
        self._stored: set[str] = set()  # FP8 weights read as stored, and their scales

    def __enter__(self) -> TensorReader:
        return self

    def __exit__(self, *exc: object) -> None:
        self._stack.close()

    @property
    def quantized(self) -> QuantizedTensors:
        """The checkpoint's FP8 weights and the tensors their scheme consumes."""
        return self._quantized

    @property
    def stored_shapes(self) -> dict[str, tuple[int, ...]]:
        """The shape of every tensor as stored (packed experts packed, scales among them)."""
        return dict(self._shapes)

    def keep_stored(self, weights: set[str]) -> None:
        """Read the FP8 `weights` (stored names, one tensor each) as stored, e4m3 entries, and
        make their scale tensors names of the reader."""
        self._stored |= {n for w in weights for n in (w, self._quantized.scales[w])}

    def names(self) -> set[str]:
        """Every tensor name, packed experts under their per-expert names, scales left out (but
        those of `keep_stored`)."""
        return set(self._entries) - (self._quantized.consumed - self._stored)

    def shape(self, name: str) -> tuple[int, ...]:
        return self._entries[name].shape

    def read(self, name: str, index: Index | None = None) -> np.ndarray:
        """Tensor `name`, or its slice `index` (one slice per axis, steps of 1)."""
        entry = self._entries[name]
        index = index or tuple(slice(0, n) for n in entry.shape)
        if entry.expert is not None:  # rows of packed[expert]
            rows = index[0]
            rows = slice(entry.row + rows.start, entry.row + rows.stop)
            index = (slice(entry.expert, entry.expert + 1), rows, *index[1:])
        value = self._read_stored(entry, index)
        value = value[0] if entry.expert is not None else value
        self.elements_read += value.size
        return value

    def _read_stored(self, entry: _Entry, index: Index) -> np.ndarray:
        """Slice `index` of the stored tensor of `entry`, an FP8 weight's dequantized."""
        if entry.stored not in self._float8:
            return self._files[entry.path].get_slice(entry.stored)[index]
        entries = read_float8(entry.path, *self._float8[entry.stored], index)
        if entry.stored in self._stored:
            return entries
        block = self._quantized.scheme.block
        return dequantize(entries, self._grid(entry.stored), block, index)

    def _grid(self, stored: str) -> np.ndarray:
        """The scale grid of the FP8 weight `stored` (read once, whole: one scale per block)."""
        if stored not in self._grids:
            scale = self._quantized.scales[stored]
            handle = self._files[self._entries[scale].path]
            block = self._quantized.scheme.block
            self._grids[stored] = scale_grid(handle.get_tensor(scale), self._shapes[stored], block)
        return self._grids[stored]

    def _add(self, name: str, entry: _Entry) -> None:
        """Register a stored tensor (a packed expert tensor as its per-expert names)."""
        match = PACKED_EXPERTS.fullmatch(name)
        if match is None:
            self._entries[name] = entry
            return
        prefix, proj = match[1], match[2]
        if len(entry.shape) != 3 or (proj == "gate_up_proj" and entry.shape[1] % 2):
            raise ValueError(f"packed expert tensor {name} has shape {list(entry.shape)}")
        experts, rows, cols = entry.shape
        halves = {"down_proj": 0} if proj == "down_proj" else {"gate_proj": 0, "up_proj": rows // 2}
        size = rows if proj == "down_proj" else rows // 2
        for e in range(experts):
            for part, row in halves.items():
                expert = _Entry(entry.path, name, (size, cols), e, row)
                self._entries[f"{prefix}.{e}.{part}.weight"] = expert
