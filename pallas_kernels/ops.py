"""The public, dispatched ops: Pallas on GPU, plain-jnp reference elsewhere (see `_dispatch`)."""

from __future__ import annotations

from pallas_kernels._dispatch import dispatched

# Gated DeltaNet path (issue 4).
from pallas_kernels import gdn_chunk as _gdn_chunk  # noqa: E402
from pallas_kernels import gdn_state_update as _gdn_state_update  # noqa: E402

gdn_chunk = dispatched(None, _gdn_chunk.gdn_chunk_reference)
gdn_state_update = dispatched(None, _gdn_state_update.gdn_state_update_reference)
