"""Gated DeltaNet chunked prefill (varlen, slots in-kernel). The Pallas kernel follows."""

from __future__ import annotations

from pallas_kernels.gdn_reference import gdn_chunk_reference, gdn_chunk_reference_chunked

__all__ = ["gdn_chunk_reference", "gdn_chunk_reference_chunked"]
