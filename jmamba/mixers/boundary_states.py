"""Prefix caching in the recurrent mixers: the states at state block boundaries inside a prefill.

When the step's prefill rows carry `boundary_slots` (prefix caching on), the scan kernels write the
recurrent state at each boundary to its slot, and the conv windows there are written beside it, so
that a later request can start from that boundary with both. Without them, nothing is added.
"""

from __future__ import annotations

import jax

from jmamba.inputs import PrefillRows
from pallas_kernels import ops


def scan_kwargs(rows: PrefillRows) -> dict:
    """The boundary arguments of `ssd_chunk_scan` / `gdn_chunk` (none without prefix caching)."""
    if rows.boundary_slots is None:
        return {}
    return dict(block_size=rows.state_block_size, boundary_slots=rows.boundary_slots)


def write_conv_windows(x: jax.Array, conv_state: jax.Array, rows: PrefillRows) -> jax.Array:
    """`conv_state` with the conv windows of `x` (the prefill section of the conv's input) at the
    rows' boundaries written to their slots; call before the prefill conv (it reads the pool)."""
    if rows.boundary_slots is None:
        return conv_state
    return ops.causal_conv1d_boundary_states(
        x,
        conv_state,
        rows.query_start_loc,
        rows.num_computed,
        rows.has_initial_state,
        rows.read_slots,
        rows.boundary_slots,
        block_size=rows.state_block_size,
    )
