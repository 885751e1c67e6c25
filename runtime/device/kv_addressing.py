"""Where a token's K/V go in the paged KV pool, computed on the device: the flat slot
`block * block_size + offset` of a position in its row's block table. The builder computes the
same on the host (`runtime.core.builder`); the device needs it for positions the host did not
know: the MTP head's chained passes (`mtp_drafts`) and rows moved back (`chaining`)."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np


def kv_slots_at(
    block_tables: jax.Array | np.ndarray, positions: jax.Array | np.ndarray, block_size: int
) -> jax.Array:
    """`positions` [R] or [R, W] (row r's in `block_tables` [R, max_blocks]) -> their flat KV
    slots, same shape; NULL where the row's table has no block there (a NULL entry, or past
    the table's width)."""
    columns = positions // block_size
    width = block_tables.shape[1]
    per_row = math.prod(positions.shape[1:])  # explicit: -1 is ambiguous for zero rows
    flat = jnp.minimum(columns, width - 1).reshape(positions.shape[0], per_row)
    blocks = jnp.take_along_axis(block_tables, flat, axis=1).reshape(positions.shape)
    blocks = jnp.where(columns < width, blocks, 0)
    return jnp.where(blocks > 0, blocks * block_size + positions % block_size, 0)
