"""Gated DeltaNet decode with fused gating (rows of 1 + K tokens). The Pallas kernel follows."""

from __future__ import annotations

from pallas_kernels.gdn_reference import gdn_state_update_reference

__all__ = ["gdn_state_update_reference"]
