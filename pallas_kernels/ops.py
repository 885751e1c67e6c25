"""The public, dispatched ops: Pallas on GPU, plain-jnp reference elsewhere (see `_dispatch`).

Models call these and nothing else from this package. Each op takes the arguments of its
`<op>_reference` plus `implementation=None | "pallas" | "interpret" | "reference"`. Prefill ops
take their ragged rows and state slots as one `Rows`.
"""

from __future__ import annotations

from pallas_kernels._dispatch import HopperKernel as _HopperKernel
from pallas_kernels._dispatch import dispatched
from pallas_kernels.attention import decode as _attention_decode
from pallas_kernels.attention import prefill as _attention_prefill
from pallas_kernels.attention import reference as _attention_reference
from pallas_kernels.conv import prefill as _conv_prefill
from pallas_kernels.conv import reference as _conv_reference
from pallas_kernels.conv import update as _conv_update
from pallas_kernels.gdn import chain_mgpu as _gdn_hopper
from pallas_kernels.gdn import chunk as _gdn_chunk
from pallas_kernels.gdn import decode as _gdn_decode
from pallas_kernels.gdn import reference as _gdn_reference
from pallas_kernels.gdn import state_update as _gdn_state_update
from pallas_kernels.matmul import fixed_tiles as _matmul
from pallas_kernels.matmul import fp8_reference as _fp8_reference
from pallas_kernels.matmul import fp8_weights as _fp8_weights
from pallas_kernels.matmul import reference as _matmul_reference
from pallas_kernels.moe import fp8_grouped_matmul as _fp8_grouped_matmul
from pallas_kernels.moe import fp8_reference as _moe_fp8_reference
from pallas_kernels.moe import grouped_matmul as _grouped_matmul
from pallas_kernels.moe import reference as _moe_reference
from pallas_kernels.norm import reference as _norm_reference
from pallas_kernels.norm import sum_squares as _sum_squares
from pallas_kernels.rows import Rows as Rows  # the prefill ops' argument type, for the models
from pallas_kernels.ssd import chunk_scan as _ssd_chunk_scan
from pallas_kernels.ssd import decode as _ssd_decode
from pallas_kernels.ssd import reference as _ssd_reference
from pallas_kernels.ssd import sequential_mgpu as _ssd_hopper
from pallas_kernels.ssd import state_update as _ssd_state_update

# Mamba2 path.
causal_conv1d_prefill = dispatched(
    _conv_prefill.causal_conv1d_prefill, _conv_reference.causal_conv1d_prefill_reference
)
causal_conv1d_update = dispatched(
    _conv_update.causal_conv1d_update, _conv_reference.causal_conv1d_update_reference
)
# Prefix caching: conv windows at state block boundaries (a jnp gather + scatter everywhere).
causal_conv1d_boundary_states = dispatched(None, _conv_reference.causal_conv1d_boundary_states)
ssd_chunk_scan = dispatched(
    _ssd_chunk_scan.ssd_chunk_scan,
    _ssd_reference.ssd_chunk_scan_reference,
    _HopperKernel(_ssd_hopper.supports, _ssd_hopper.ssd_chunk_scan_hopper),
)
ssd_state_update = dispatched(
    _ssd_state_update.ssd_state_update, _ssd_reference.ssd_state_update_reference
)
# Decode fused: conv update + state update reading in_proj's output by column offset.
mamba2_decode = dispatched(_ssd_decode.mamba2_decode, _ssd_reference.mamba2_decode_reference)

# Gated DeltaNet path.
gdn_chunk = dispatched(
    _gdn_chunk.gdn_chunk,
    _gdn_reference.gdn_chunk_reference,
    _HopperKernel(_gdn_hopper.supports, _gdn_hopper.gdn_chunk_hopper),
)
gdn_state_update = dispatched(
    _gdn_state_update.gdn_state_update, _gdn_reference.gdn_state_update_reference
)
# Decode fused: conv update + l2norm + gating + state update reading in_proj's output.
gdn_decode = dispatched(_gdn_decode.gdn_decode, _gdn_reference.gdn_decode_reference)

# Attention over the paged KV cache: decode lanes and prefill tokens, each row reading its own
# blocks.
paged_decode_attention = dispatched(
    _attention_decode.paged_decode_attention,
    _attention_reference.paged_decode_attention_reference,
)
paged_attention = dispatched(
    _attention_prefill.paged_prefill_attention, _attention_reference.paged_attention_reference
)
write_kv = _attention_reference.write_kv

# MoE routed experts: rows grouped by expert; the kernel reads only the experts that have rows.
grouped_matmul = dispatched(_grouped_matmul.grouped_matmul, _moe_reference.grouped_matmul_reference)
# FP8 experts (e4m3 stacks, fp32 block scales) read as they are stored, rows in their own dtype.
fp8_grouped_matmul = dispatched(
    _fp8_grouped_matmul.fp8_grouped_matmul, _moe_fp8_reference.fp8_grouped_matmul_reference
)

# Batch invariant: dense projections and the norms' row statistics, each row rounded the same
# whatever other rows share the call.
matmul = dispatched(_matmul.matmul, _matmul_reference.matmul_reference)
row_sum_squares = dispatched(
    _sum_squares.row_sum_squares, _norm_reference.row_sum_squares_reference
)
# FP8 weights (e4m3, fp32 block scales) read as they are stored, times activations in their own
# dtype; batch invariant like `matmul`.
fp8_weight_matmul = dispatched(
    _fp8_weights.fp8_weight_matmul, _fp8_reference.fp8_weight_matmul_reference
)
