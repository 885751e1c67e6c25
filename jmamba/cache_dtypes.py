"""The dtypes of a model's cache pools (`HybridLM.init_caches`), named as an engine takes them.

- `kv_cache`: "auto", the model's activation dtype, or "fp8": float8_e4m3fn (vLLM's
  `--kv-cache-dtype fp8`, alias "fp8_e4m3"), half the bytes of a bf16 block. K and V are stored
  divided by a per-layer scale and clipped to e4m3's +-448, and read back times it inside the
  attention kernels (`pallas_kernels.attention.reference`). The scales are a checkpoint's
  `k_scale` / `v_scale` where it has them (`jmamba.checkpoints.quantization.kv_scales`), else
  1.0: values clipped and cast, which is what vLLM does without calibrated scales.
- `state`: the Mamba2 SSM state and the Gated DeltaNet recurrent state, "float32" (the default:
  bitwise properties such as prefix-cache hits and speculative rollback are measured in it) or
  "bfloat16" (vLLM's `--mamba-ssm-cache-dtype`), half the bytes of a slot's recurrent state. The
  kernels read it as fp32, accumulate in fp32 and store in this dtype. Conv states stay in the
  activation dtype.

No jax: the engine's host side checks the names with it.
"""

from __future__ import annotations

import dataclasses

import ml_dtypes
import numpy as np
from numpy.typing import DTypeLike

KV_CACHE_DTYPES = ("auto", "fp8")
KV_CACHE_ALIASES = {"fp8_e4m3": "fp8"}  # vLLM's other name of the same e4m3 cache
STATE_DTYPES = ("float32", "bfloat16")


def kv_cache_dtype_name(value: object) -> str:
    """`value` as one of KV_CACHE_DTYPES (an alias resolved); else ValueError."""
    name = KV_CACHE_ALIASES.get(value, value) if isinstance(value, str) else value
    if name not in KV_CACHE_DTYPES:
        allowed = (*KV_CACHE_DTYPES, *KV_CACHE_ALIASES)
        raise ValueError(f"kv_cache_dtype={value!r} must be one of {allowed}")
    return str(name)


def state_dtype_name(value: object) -> str:
    """`value` if it is one of STATE_DTYPES; else ValueError."""
    if value not in STATE_DTYPES:
        raise ValueError(f"state_dtype={value!r} must be one of {STATE_DTYPES}")
    return str(value)


@dataclasses.dataclass(frozen=True)
class CacheDtypes:
    """The cache pools' dtypes by name (module docstring).

    Attributes:
      kv_cache: "auto" or "fp8" (aliases resolved: `of`).
      state: "float32" or "bfloat16".
    """

    kv_cache: str = "auto"
    state: str = "float32"

    def __post_init__(self) -> None:
        if kv_cache_dtype_name(self.kv_cache) != self.kv_cache:
            raise ValueError(f"kv_cache={self.kv_cache!r}: use CacheDtypes.of for an alias")
        state_dtype_name(self.state)

    @classmethod
    def of(cls, kv_cache_dtype: object = "auto", state_dtype: object = "float32") -> CacheDtypes:
        """The dtypes of these names, an alias resolved; ValueError naming a bad one."""
        return cls(kv_cache_dtype_name(kv_cache_dtype), state_dtype_name(state_dtype))

    def kv_dtype(self, activation: DTypeLike) -> np.dtype:
        """The KV pools' dtype for a model computing in `activation`."""
        if self.kv_cache == "fp8":
            return np.dtype(ml_dtypes.float8_e4m3fn)
        return np.dtype(activation)

    @property
    def state_dtype(self) -> np.dtype:
        """The recurrent states' dtype."""
        return np.dtype(ml_dtypes.bfloat16 if self.state == "bfloat16" else np.float32)

    def describe(self) -> str:
        """`kv_cache_dtype=..., state_dtype=...`, as the engine's options name them."""
        return f"kv_cache_dtype={self.kv_cache}, state_dtype={self.state}"


DEFAULT_CACHE_DTYPES = CacheDtypes()  # the model's dtype for KV, fp32 recurrent states
