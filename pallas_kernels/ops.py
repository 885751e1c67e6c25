"""The public, dispatched ops: Pallas on GPU, plain-jnp reference elsewhere (see `_dispatch`).

Models call these and nothing else from this package. Each op takes the arguments of its
`<op>_reference` plus `implementation=None | "pallas" | "interpret" | "reference"`.
"""

from __future__ import annotations

from pallas_kernels import causal_conv1d as _conv1d
from pallas_kernels import causal_conv1d_reference as _conv1d_reference
from pallas_kernels import gdn_chunk as _gdn_chunk
from pallas_kernels import gdn_decode as _gdn_decode
from pallas_kernels import gdn_state_update as _gdn_state_update
from pallas_kernels import grouped_matmul as _grouped_matmul
from pallas_kernels import mamba2_decode as _mamba2_decode
from pallas_kernels import paged_attention as _paged_attention
from pallas_kernels import paged_decode_attention as _paged_decode_attention
from pallas_kernels import ssd_chunk_scan as _ssd_chunk_scan
from pallas_kernels import ssd_chunk_scan_reference as _ssd_chunk_scan_reference
from pallas_kernels import ssd_state_update as _ssd_state_update
from pallas_kernels._dispatch import dispatched

# Mamba2 path.
causal_conv1d_prefill = dispatched(
    _conv1d.causal_conv1d_prefill, _conv1d_reference.causal_conv1d_prefill_reference
)
causal_conv1d_update = dispatched(
    _conv1d.causal_conv1d_update, _conv1d_reference.causal_conv1d_update_reference
)
# Prefix caching: conv windows at state block boundaries (a jnp gather + scatter everywhere).
causal_conv1d_boundary_states = dispatched(None, _conv1d_reference.causal_conv1d_boundary_states)
ssd_chunk_scan = dispatched(
    _ssd_chunk_scan.ssd_chunk_scan, _ssd_chunk_scan_reference.ssd_chunk_scan_reference
)
ssd_state_update = dispatched(
    _ssd_state_update.ssd_state_update, _ssd_state_update.ssd_state_update_reference
)
# Decode fused: conv update + state update reading in_proj's output by column offset.
mamba2_decode = dispatched(_mamba2_decode.mamba2_decode, _mamba2_decode.mamba2_decode_reference)

# Gated DeltaNet path.
gdn_chunk = dispatched(_gdn_chunk.gdn_chunk, _gdn_chunk.gdn_chunk_reference)
gdn_state_update = dispatched(
    _gdn_state_update.gdn_state_update, _gdn_state_update.gdn_state_update_reference
)
# Decode fused: conv update + l2norm + gating + state update reading in_proj's output.
gdn_decode = dispatched(_gdn_decode.gdn_decode, _gdn_decode.gdn_decode_reference)

# Attention over the paged KV cache: decode lanes through the kernel, prefill tokens through the
# ragged reference (no prefill kernel yet).
paged_decode_attention = dispatched(
    _paged_decode_attention.paged_decode_attention,
    _paged_decode_attention.paged_decode_attention_reference,
)
paged_attention = dispatched(None, _paged_attention.paged_attention_reference)
write_kv = _paged_attention.write_kv

# MoE routed experts: rows grouped by expert; the kernel reads only the experts that have rows.
grouped_matmul = dispatched(
    _grouped_matmul.grouped_matmul, _grouped_matmul.grouped_matmul_reference
)
