"""`Rows`: a pytree of the row arrays whose block size stays a static int, and its shape checks."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from pallas_kernels.rows import Rows


def rows(num_rows: int = 3, boundary: int | None = 2, block_size: int | None = 16) -> Rows:
    i32 = lambda n: np.zeros(n, np.int32)  # noqa: E731
    boundary_slots = None if boundary is None else np.zeros((num_rows, boundary), np.int32)
    qsl = np.arange(num_rows + 1, dtype=np.int32)
    return Rows(
        qsl,
        i32(num_rows),
        np.zeros(num_rows, bool),
        i32(num_rows),
        i32(num_rows),
        boundary_slots,
        block_size,
    )


def test_the_arrays_are_leaves_and_the_block_size_stays_static_under_jit():
    r = rows()
    assert len(jax.tree_util.tree_leaves(r)) == 6
    assert len(jax.tree_util.tree_leaves(rows(boundary=None, block_size=None))) == 5
    traces = []

    @jax.jit
    def block_size_as_a_shape(r: Rows) -> jax.Array:
        traces.append(r.block_size)
        return jnp.zeros(r.block_size) + r.num_computed.sum()  # a traced leaf cannot be a shape

    assert block_size_as_a_shape(r).shape == (16,)
    assert block_size_as_a_shape(rows(block_size=32)).shape == (32,)  # a new size: a new trace
    block_size_as_a_shape(rows())
    assert traces == [16, 32]


@pytest.mark.parametrize(
    ("change", "match"),
    [
        (
            dict(num_computed=np.zeros(2, np.int32)),
            r"num_computed has shape \(2,\); expected \(3,\)",
        ),
        (dict(write_slots=np.zeros((3, 1), np.int32)), "write_slots has shape"),
        (dict(boundary_slots=np.zeros((2, 2), np.int32)), "boundary_slots has shape"),
        (dict(block_size=None), "must be given together"),
        (dict(block_size=24), "block_size=24 must be a positive multiple of chunk_size=16"),
    ],
)
def test_check_names_the_field_that_breaks_the_contract(change, match):
    fields = {name: getattr(rows(), name) for name in Rows.__dataclass_fields__}
    with pytest.raises(ValueError, match=match):
        Rows(**(fields | change)).check(chunk_size=16)


def test_check_returns_the_row_count():
    assert rows().check(chunk_size=16) == 3
    assert rows(boundary=None, block_size=None).check() == 3
