"""The public, dispatched ops: Pallas on GPU, plain-jnp reference elsewhere (see `_dispatch`)."""

from __future__ import annotations

from pallas_kernels._dispatch import dispatched

# Gated DeltaNet path (issue 4).
from pallas_kernels import gdn_chunk as _gdn_chunk  # noqa: E402
from pallas_kernels import gdn_state_update as _gdn_state_update  # noqa: E402

gdn_chunk = dispatched(_gdn_chunk.gdn_chunk, _gdn_chunk.gdn_chunk_reference)
gdn_state_update = dispatched(
    _gdn_state_update.gdn_state_update, _gdn_state_update.gdn_state_update_reference
)

from pallas_kernels import causal_conv1d as _conv1d  # noqa: E402
from pallas_kernels import ssd_chunk_scan as _ssd_chunk_scan  # noqa: E402
from pallas_kernels import ssd_state_update as _ssd_state_update  # noqa: E402

# Mamba2 path (issue 3). The first argument becomes the Pallas entry once it exists.
causal_conv1d_prefill = dispatched(
    _conv1d.causal_conv1d_prefill, _conv1d.causal_conv1d_prefill_reference
)
causal_conv1d_update = dispatched(
    _conv1d.causal_conv1d_update, _conv1d.causal_conv1d_update_reference
)
ssd_chunk_scan = dispatched(
    _ssd_chunk_scan.ssd_chunk_scan, _ssd_chunk_scan.ssd_chunk_scan_reference
)
ssd_state_update = dispatched(
    _ssd_state_update.ssd_state_update, _ssd_state_update.ssd_state_update_reference
)
