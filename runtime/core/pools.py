"""`Pool`: reference-counted ids of a device pool (KV blocks or state slots); id 0 is NULL.

Id 0 is reserved in every pool: it is never handed out, and it is the only id padding may use
(docs/architecture.md section 5). Reference counts let prefix caching share an id later; today every
id has one owner. Ids are handed out lowest first, so pools stay compact and runs are reproducible.
"""

from __future__ import annotations

import heapq

import numpy as np

NULL = 0


class Pool:
    """`size` ids, 0 reserved: `can_allocate`/`allocate`, `share`, `free`."""

    def __init__(self, name: str, size: int) -> None:
        if size < 2:
            raise ValueError(f"{name} pool size={size} must be >= 2 (id 0 is NULL)")
        self.name = name
        self.size = size
        self.ref_counts = np.zeros(size, np.int32)
        self._free = list(range(1, size))  # a heap: lowest id first

    @property
    def num_free(self) -> int:
        return len(self._free)

    @property
    def num_used(self) -> int:
        return self.size - 1 - self.num_free

    def can_allocate(self, n: int) -> bool:
        return n <= len(self._free)

    def allocate(self, n: int) -> list[int]:
        """Take n free ids (reference count 1 each)."""
        if not self.can_allocate(n):
            raise RuntimeError(f"{self.name} pool: {n} ids asked, {self.num_free} free")
        ids = [heapq.heappop(self._free) for _ in range(n)]
        for i in ids:  # a few ids a call: scalar stores beat numpy's fancy indexing
            self.ref_counts[i] = 1
        return ids

    def share(self, ids: list[int]) -> None:
        """Add one owner to each id (prefix caching)."""
        for i in ids:
            self._check_live(i)
            self.ref_counts[i] += 1

    def free(self, ids: list[int]) -> None:
        """Drop one owner of each id; an id with no owner left returns to the free list."""
        for i in ids:
            self._check_live(i)
            count = self.ref_counts[i] - 1
            self.ref_counts[i] = count
            if count == 0:
                heapq.heappush(self._free, i)

    def _check_live(self, i: int) -> None:
        if i == NULL or not 0 < i < self.size or self.ref_counts[i] <= 0:
            raise RuntimeError(f"{self.name} pool: id {i} is NULL, out of range or not allocated")
