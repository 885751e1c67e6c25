"""Row layouts of a grid point (ragged prefill rows, decode rows of 1 + K lanes), state pools full
of garbage with NaN in slot 0, and the random inputs the grid draws."""

from __future__ import annotations

import dataclasses

import jax.numpy as jnp
import numpy as np

from benchmarks.checks.kernels.case import F32
from pallas_kernels.rows import Rows


def random_pool(rng, num_slots: int, tail: tuple[int, ...], dtype) -> np.ndarray:
    """Random garbage in every slot (pools are not zeroed on allocation), NaN in slot 0."""
    pool = rng.standard_normal((num_slots, *tail)).astype(np.float32)
    pool[0] = np.nan
    return np.asarray(jnp.asarray(pool, dtype))


def block_table(rng, lengths: list[int], block_size: int, rows: int) -> tuple[np.ndarray, int]:
    """(table [rows, max_blocks], num_blocks): row r holds the blocks of lengths[r] tokens, drawn
    at random without repeats from [1, num_blocks), NULL past them (rows past `lengths` are all
    NULL); the pool has room for every row's full table plus two blocks no row owns."""
    max_blocks = -(-max(lengths) // block_size)
    num_blocks = rows * max_blocks + 2
    table = np.zeros((rows, max_blocks), np.int32)
    free = list(rng.permutation(np.arange(1, num_blocks)))
    for r, length in enumerate(lengths):
        n = -(-length // block_size)
        table[r, :n] = [free.pop() for _ in range(n)]
    return table, num_blocks


@dataclasses.dataclass(frozen=True)
class Varlen:
    """Ragged prefill rows of `lengths`, a padding row and padding tokens; slots drawn at random."""

    qsl: np.ndarray
    num_computed: np.ndarray
    has_init: np.ndarray
    read: np.ndarray
    write: np.ndarray
    boundary: np.ndarray  # [R, NB]
    num_slots: int
    num_tokens: int

    @property
    def live(self) -> np.ndarray:
        return np.arange(self.num_tokens) < self.qsl[-1]

    @property
    def written(self) -> np.ndarray:
        return np.concatenate([self.write, self.boundary.ravel()])

    def describe(self) -> str:
        return f"T={self.num_tokens} R={len(self.read)} lengths={np.diff(self.qsl).tolist()}"

    def as_rows(self, block_size: int | None) -> Rows:
        """The ops' `Rows`: with the boundary slots and `block_size`, or without either (a call
        that caches nothing; its boundary slots then stay as they were)."""
        rows = (self.qsl, self.num_computed, self.has_init, self.read, self.write)
        return Rows(*rows) if block_size is None else Rows(*rows, self.boundary, block_size)


def varlen(rng, lengths: list[int], block: int, pad_tokens: int = 5) -> Varlen:
    rows = len(lengths) + 1
    qsl = np.concatenate([[0], np.cumsum(list(lengths) + [0])]).astype(np.int32)
    # Row kinds by index: fresh; continuing (mid-block); continuing from a block boundary;
    # continuing without an initial state; fresh but told to read one (the kernel obeys the flag).
    kind = np.arange(rows) % 5
    nc = np.where(kind == 2, block * rng.integers(1, 4, rows), rng.integers(1, 3 * block, rows))
    nc = np.where(kind == 0, 0, nc).astype(np.int32)
    has_init = (kind == 1) | (kind == 2) | (kind == 4)
    nc[kind == 4] = 0
    nb = max(1, max((int(n) % block + int(m)) // block for n, m in zip(nc, lengths, strict=False)))
    slots = rng.permutation(np.arange(1, 2 * rows + rows * nb + 3)).astype(np.int32)
    read, write = slots[:rows], slots[rows : 2 * rows].copy()
    write[1] = read[1]  # one row updated in place
    boundary = slots[2 * rows : 2 * rows + rows * nb].reshape(rows, nb)
    boundary[rng.random(boundary.shape) < 0.2] = 0  # some boundaries are not cached
    for a in (nc, read, write, boundary):  # the padding row
        a[-1] = 0
    has_init[-1] = False
    return Varlen(
        qsl, nc, has_init, read, write, boundary, len(slots) + 1, int(qsl[-1]) + pad_tokens
    )


def lanes(rng, batch: int, width: int) -> tuple[np.ndarray, np.ndarray, int]:
    """Decode rows of 1 + K lanes: read slots [B], write slots [B, L], pool size. Row 0 has a dead
    last lane (or is updated in place when L = 1); the last row is padding."""
    slots = rng.permutation(np.arange(1, batch * (width + 1) + 3)).astype(np.int32)
    read, write = slots[:batch], slots[batch : batch * (width + 1)].reshape(batch, width).copy()
    if width == 1:
        write[0, 0] = read[0]
    else:
        write[0, -1] = 0
    read[-1], write[-1] = 0, 0
    return read, write, len(slots) + 1


def lane_live(write: np.ndarray, tail: int) -> np.ndarray:
    return (write > 0).reshape(write.shape + (1,) * tail)


def row_lengths(chunk: int) -> list[int]:
    """1, chunk - 1, chunk, chunk + 1, 2 chunk + 2, 3 chunks + a remainder, and two short rows."""
    return [1, chunk - 1, chunk, 2, chunk + 1, 2 * chunk + 2, 5, 3 * chunk + chunk // 2 + 3]


def normal(rng, shape, dtype=F32, scale: float = 1.0, shift: float = 0.0) -> np.ndarray:
    x = rng.standard_normal(shape).astype(np.float32) * scale + shift
    return np.asarray(jnp.asarray(x, dtype))
