"""Pool: NULL id 0 is never handed out; reference counts; lowest ids first."""

from __future__ import annotations

import pytest

from runtime.core.pools import Pool


def test_null_never_allocated():
    """Allocating every id never yields 0."""
    pool = Pool("block", 5)
    ids = pool.allocate(4)
    assert sorted(ids) == [1, 2, 3, 4] and pool.num_free == 0
    assert not pool.can_allocate(1)
    with pytest.raises(RuntimeError, match="1 ids asked, 0 free"):
        pool.allocate(1)


def test_free_returns_ids_lowest_first():
    """Freed ids come back, lowest first."""
    pool = Pool("slot", 6)
    a = pool.allocate(3)
    pool.free([a[2], a[0]])
    assert pool.allocate(2) == [1, 3]


def test_shared_id_needs_every_owner_to_free():
    """A shared id returns to the free list only when its last owner frees it."""
    pool = Pool("block", 3)
    [i] = pool.allocate(1)
    pool.share([i])
    pool.free([i])
    assert pool.num_free == 1
    pool.free([i])
    assert pool.num_free == 2


@pytest.mark.parametrize("bad", [0, 7, 2])
def test_free_of_null_or_unallocated_raises(bad):
    """Freeing NULL, an out-of-range id or a free id is a bookkeeping bug and raises."""
    pool = Pool("block", 4)
    pool.allocate(1)
    with pytest.raises(RuntimeError):
        pool.free([bad])


def test_tiny_pool_rejected():
    with pytest.raises(ValueError, match="size=1"):
        Pool("slot", 1)
