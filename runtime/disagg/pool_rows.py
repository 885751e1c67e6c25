"""`PoolRows`: one request's rows of every device cache pool, read out of a runner's caches and
written into another's.

A runner's caches are a pytree of arrays whose first axis is a pool axis: the KV blocks of every
attention layer (`KVCache.k` / `.v`, `[ranks * num_blocks, block_size, heads, dim]`) or the state
slots of every recurrent layer (`Mamba2State`, `GDNState`: `[ranks * num_slots, ...]`; a
`ParallelHybridCache` holds one of each). A request owns the same block ids in every attention
layer and one slot index in every recurrent layer (docs/architecture.md section 6), so its
contents are, per block leaf, its blocks' rows and, per slot leaf, its slot's row.

Reading gathers them (not donated: the caches stay the runner's). Writing scatters them with the
caches donated, as a step replaces them; its block list is padded to a power of two with an
out-of-range id and `mode="drop"`, so padding writes nothing and no block 0 or slot 0 is ever
written (section 5: NULL stays bit-identical). Both compile once per padded block count.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import jax
import jax.numpy as jnp
import numpy as np

from jmamba.mixers.attention import KVCache
from jmamba.mixers.gated_deltanet import GDNState
from jmamba.mixers.mamba2 import Mamba2State

if TYPE_CHECKING:
    from runtime.engine import Engine

BLOCK, SLOT = "block", "slot"


def leaf_kinds(caches: Any) -> tuple[str, ...]:
    """Per leaf of `caches` (in `jax.tree.leaves` order), whether its pool axis is KV blocks or
    state slots."""

    def is_pool(node: Any) -> bool:
        return isinstance(node, KVCache | Mamba2State | GDNState)

    kinds: list[str] = []
    for node in jax.tree.leaves(caches, is_leaf=is_pool):
        kind = BLOCK if isinstance(node, KVCache) else SLOT
        kinds += [kind] * len(jax.tree.leaves(node))
    return tuple(kinds)


def padded_count(n: int, limit: int) -> int:
    """The block count a read or write of n blocks is compiled for: the next power of two, at
    most `limit` (a request's most blocks), so few programs exist."""
    return min(1 << max(n - 1, 0).bit_length(), max(limit, n, 1))


class PoolRows:
    """Reads and writes one request's pool rows in a runner's caches.

    Attributes:
      kinds: per cache leaf, `BLOCK` or `SLOT`.
      row_layout: per cache leaf, (kind, the shape of one row, its dtype name): what a peer's
        rows must match (`runtime.disagg.fingerprint`).
    """

    def __init__(self, caches: Any, shardings: Any, *, num_blocks: int, num_slots: int) -> None:
        """`caches` / `shardings`: a runner's (`ModelRunner.caches`, `.cache_shardings`);
        `num_blocks` / `num_slots`: one rank's pool sizes."""
        self.kinds = leaf_kinds(caches)
        leaves = jax.tree.leaves(caches)
        self.row_layout = tuple(
            (kind, tuple(leaf.shape[1:]), str(leaf.dtype))
            for kind, leaf in zip(self.kinds, leaves, strict=True)
        )
        self.num_blocks, self.num_slots = num_blocks, num_slots
        kinds = self.kinds
        self._read = jax.jit(functools.partial(_read_rows, kinds))
        self._write = jax.jit(
            functools.partial(_write_rows, kinds), donate_argnums=0, out_shardings=shardings
        )

    def read(
        self, caches: Any, rank: int, block_ids: Sequence[int], slot: int, limit: int
    ) -> tuple[list[np.ndarray], list[np.ndarray]]:
        """(per block leaf its rows of `block_ids`, per slot leaf its row of `slot`) of local rank
        `rank`, on the host. `limit`: the most blocks a request holds."""
        n = len(block_ids)
        ids = np.zeros(padded_count(n, limit), np.int32)  # padding reads NULL, then is cut off
        ids[:n] = np.asarray(block_ids, np.int32) + rank * self.num_blocks
        slot_index = np.int32(slot + rank * self.num_slots)
        rows = [np.asarray(a) for a in self._read(caches, ids, slot_index)]
        blocks = [r[:n] for r, kind in zip(rows, self.kinds, strict=True) if kind == BLOCK]
        slots = [r for r, kind in zip(rows, self.kinds, strict=True) if kind == SLOT]
        return blocks, slots

    def write(
        self,
        caches: Any,
        rank: int,
        block_ids: Sequence[int],
        slot: int,
        block_rows: Sequence[np.ndarray],
        slot_rows: Sequence[np.ndarray],
        limit: int,
    ) -> Any:
        """`caches` (donated) with local rank `rank`'s blocks `block_ids` and slot `slot` holding
        the given rows; ids and slot must be live entries (> 0), never NULL."""
        uses_slots = SLOT in self.kinds
        if any(b <= 0 or b >= self.num_blocks for b in block_ids) or (
            uses_slots and not 0 < slot < self.num_slots
        ):
            raise ValueError(f"blocks {list(block_ids)} / slot {slot}: not live pool entries")
        n, padded = len(block_ids), padded_count(len(block_ids), limit)
        out_of_range = np.int32(np.iinfo(np.int32).max)  # dropped by the scatter
        ids = np.full(padded, out_of_range, np.int32)
        ids[:n] = np.asarray(block_ids, np.int32) + rank * self.num_blocks
        slot_index = np.int32(slot + rank * self.num_slots)
        padded_rows = [_pad_rows(r, padded) for r in block_rows]
        return self._write(caches, ids, slot_index, padded_rows, list(slot_rows))


def _pad_rows(rows: np.ndarray, count: int) -> np.ndarray:
    """`rows` [n, ...] grown with zero rows to [count, ...] (the dropped padding's contents)."""
    if len(rows) == count:
        return rows
    return np.concatenate([rows, np.zeros((count - len(rows), *rows.shape[1:]), rows.dtype)])


def _read_rows(kinds: tuple[str, ...], caches: Any, ids: jax.Array, slot: jax.Array) -> list:
    """Per cache leaf: its rows `ids` (a block leaf) or its row `slot` (a slot leaf)."""
    leaves = jax.tree.leaves(caches)
    return [
        leaf[ids] if kind == BLOCK else leaf[slot] for kind, leaf in zip(kinds, leaves, strict=True)
    ]


def _write_rows(
    kinds: tuple[str, ...],
    caches: Any,
    ids: jax.Array,
    slot: jax.Array,
    block_rows: list[jax.Array],
    slot_rows: list[jax.Array],
) -> Any:
    """`caches` with the rows written: block leaves at `ids` (out-of-range ids dropped), slot
    leaves at `slot`."""
    leaves, treedef = jax.tree.flatten(caches)
    blocks, slots = iter(block_rows), iter(slot_rows)
    written = []
    for kind, leaf in zip(kinds, leaves, strict=True):
        if kind == BLOCK:
            written.append(leaf.at[ids].set(next(blocks).astype(leaf.dtype), mode="drop"))
        else:
            written.append(leaf.at[slot].set(jnp.asarray(next(slots)).astype(leaf.dtype)))
    return jax.tree.unflatten(treedef, written)


def engine_pool_rows(engine: Engine) -> PoolRows:
    """The `PoolRows` of an engine's runner (one rank's pool sizes from its config)."""
    runner, config = engine.runner, engine.config
    return PoolRows(
        runner.caches,
        runner.cache_shardings,
        num_blocks=config.num_blocks,
        num_slots=config.num_slots,
    )
