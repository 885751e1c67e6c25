"""Pallas GPU kernels (Triton lowering) for hybrid-model serving, one op per module.

Models call the dispatched ops of `pallas_kernels.ops`, never a kernel module directly.
"""
