"""One host->device transfer per step: every leaf of a step's inputs packed into one int32 buffer.

A step's `StepInputs` and `SamplingInputs` have ~18 small arrays; passing them to the compiled
step as numpy arrays costs one host->device copy each. `pack` concatenates their bytes into one
fresh int32 buffer (built from the step's fresh arrays, so nothing is carried over between steps)
and `unpack`, inside the jitted step, slices it back into the same pytree. The `Layout` (offsets,
shapes, dtypes and tree structure) is static: it is fixed by the bucket.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

import jmamba.step.pytree  # noqa: F401  (registers StepInputs as a pytree before anything flattens it)

# Leaf dtypes by `dtype.char` (cheap to read, unlike `dtype.name`): int32 as is, float32 and uint32
# bit for bit, bool widened to 0/1.
_DTYPES = {
    "i": np.dtype(np.int32),
    "f": np.dtype(np.float32),
    "I": np.dtype(np.uint32),
    "?": np.dtype(np.bool_),
}


@dataclasses.dataclass(frozen=True)
class Layout:
    """Where each leaf of a pytree lives in the packed int32 buffer (hashable: a static arg).

    Attributes:
      treedef: the pytree structure.
      leaves: per leaf (offset, shape, dtype char), in `jax.tree.leaves` order.
      size: int32 words in the buffer.
    """

    treedef: Any
    leaves: tuple[tuple[int, tuple[int, ...], str], ...]
    size: int


def layout_of(tree: Any) -> Layout:
    """The layout of `tree`, whose leaves are numpy arrays of int32, float32, uint32 or bool."""
    leaves, treedef = jax.tree.flatten(tree)
    entries, offset = [], 0
    for leaf in leaves:
        dtype = np.dtype(leaf.dtype)
        if _DTYPES.get(dtype.char) != dtype:
            raise ValueError(f"cannot pack a leaf of dtype {dtype} (int32, float32, uint32, bool)")
        entries.append((offset, tuple(leaf.shape), dtype.char))
        offset += int(np.prod(leaf.shape, dtype=np.int64))
    return Layout(treedef, tuple(entries), offset)


def pack(tree: Any, layout: Layout) -> np.ndarray:
    """[layout.size] int32: every leaf of `tree` (shaped as in `layout`), flattened, in order."""
    leaves = jax.tree.leaves(tree)
    if len(leaves) != len(layout.leaves):
        raise ValueError(f"tree has {len(leaves)} leaves, layout {len(layout.leaves)}")
    parts = []
    for leaf, (_, shape, dtype) in zip(leaves, layout.leaves, strict=True):
        if leaf.shape != shape or leaf.dtype.char != dtype:
            want = f"{_DTYPES[dtype]}{shape}"
            raise ValueError(f"leaf {leaf.dtype}{leaf.shape} does not match {want}")
        flat = leaf.reshape(-1)
        parts.append(flat.view(np.int32) if leaf.itemsize == 4 else flat.astype(np.int32))
    return np.concatenate(parts) if parts else np.zeros(0, np.int32)


def unpack(buffer: jax.Array, layout: Layout) -> Any:
    """Inverse of `pack`, traced inside the jitted step: slices of one device buffer."""
    leaves = []
    for offset, shape, dtype in layout.leaves:
        size = int(np.prod(shape, dtype=np.int64))
        words = buffer[offset : offset + size].reshape(shape)
        if dtype == "?":
            leaves.append(words != 0)
        elif dtype == "i":
            leaves.append(words)
        else:
            leaves.append(jax.lax.bitcast_convert_type(words, jnp.dtype(_DTYPES[dtype])))
    return jax.tree.unflatten(layout.treedef, leaves)
