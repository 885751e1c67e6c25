"""The recurrent mixers' prefill rows as the kernels see them, and prefix caching's conv windows.

`kernel_rows` turns the step's `PrefillRows` into the kernels' `Rows`. When the rows carry
`boundary_slots` (prefix caching on), the scan kernels write the recurrent state at each state
block boundary to its slot, and `write_conv_windows` writes the conv windows there beside it, so
that a later request can start from that boundary with both. Without them, nothing is added.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from jmamba.step.pytree import PrefillRows
from pallas_kernels import ops


def kernel_rows(rows: PrefillRows) -> ops.Rows:
    """The prefill section as the kernels' `Rows`; the boundary block size only with prefix
    caching (`PrefillRows` holds 0 there without it, `Rows` None)."""
    boundary_slots = rows.boundary_slots
    return ops.Rows(
        query_start_loc=jnp.asarray(rows.query_start_loc),
        num_computed=jnp.asarray(rows.num_computed),
        has_initial_state=jnp.asarray(rows.has_initial_state),
        read_slots=jnp.asarray(rows.read_slots),
        write_slots=jnp.asarray(rows.write_slots),
        boundary_slots=None if boundary_slots is None else jnp.asarray(boundary_slots),
        block_size=None if boundary_slots is None else rows.state_block_size,
    )


def write_conv_windows(x: jax.Array, conv_state: jax.Array, rows: ops.Rows) -> jax.Array:
    """`conv_state` with the conv windows of `x` (the prefill section of the conv's input) at the
    rows' boundaries written to their slots; call before the prefill conv (it reads the pool)."""
    if rows.boundary_slots is None:
        return conv_state
    return ops.causal_conv1d_boundary_states(x, conv_state, rows)
