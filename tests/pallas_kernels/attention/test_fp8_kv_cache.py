"""An FP8 KV cache (`kv_cache_dtype="fp8"`): float8_e4m3fn pools, written by `quantize_kv` (x /
scale, clipped to +-448, cast) and read back times the scale by the decode and prefill kernels
(interpret mode) and their references.

Given the same FP8 pool, kernel and reference agree as closely as for an fp32 pool (the cast on
load is exact). Against the fp32 pool the FP8 one was made from, the outputs differ by e4m3's
rounding of the keys and values (3 mantissa bits: up to 2^-4 relative each; a query seeing one
key outputs its rounded value): asserted, at most 2^-4 of the largest |value| and 0.01 on
average (measured on these N(0, 1) cases: 0.028 of it, 0.005).
"""

from __future__ import annotations

import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from pallas_kernels.attention.decode import paged_decode_attention
from pallas_kernels.attention.prefill import paged_prefill_attention
from pallas_kernels.attention.reference import (
    paged_attention_reference,
    paged_decode_attention_reference,
    quantize_kv,
)
from tests.pallas_kernels.attention import test_paged_decode_attention as decode
from tests.pallas_kernels.attention import test_paged_prefill_attention as prefill

E4M3 = np.dtype(ml_dtypes.float8_e4m3fn)


def as_fp8(case: tuple, k_scale: float, v_scale: float) -> tuple:
    """`case` with its K and V pools quantized as `write_kv` stores them (the NaN NULL block
    stays NaN: e4m3fn has a NaN)."""
    q, k, v, *rest = case
    k8 = np.asarray(quantize_kv(jnp.asarray(k), E4M3, k_scale))
    v8 = np.asarray(quantize_kv(jnp.asarray(v), E4M3, v_scale))
    assert np.isnan(k8[0].astype(np.float32)).all()
    return (q, k8, v8, *rest)


def check(kernel_out, fp8_ref, fp32_ref, v_cache: np.ndarray) -> None:
    out, fp8_ref, fp32_ref = (np.asarray(a, np.float32) for a in (kernel_out, fp8_ref, fp32_ref))
    assert np.isfinite(out).all()  # the NaN NULL block never reaches an output
    np.testing.assert_allclose(out, fp8_ref, atol=2e-6, rtol=1e-5)
    error = np.abs(fp8_ref - fp32_ref)
    assert error.max() <= 2.0**-4 * np.abs(v_cache[1:]).max() and error.mean() < 0.01


@pytest.mark.parametrize(
    "width, heads, kv_heads, head_dim, block_size, scales, knobs",
    [
        (2, 6, 3, 24, 8, (1.0, 1.0), dict(block_k=16)),
        (3, 5, 1, 80, 16, (0.3, 1.7), dict(block_k=32, num_splits=3)),
    ],
)
def test_decode_reads_an_fp8_pool(width, heads, kv_heads, head_dim, block_size, scales, knobs):
    rng = np.random.default_rng(head_dim)
    case = decode.make_case(
        rng, width=width, heads=heads, kv_heads=kv_heads, head_dim=head_dim, block_size=block_size
    )
    fp8 = as_fp8(case, *scales)
    scale = head_dim**-0.5
    k_scale, v_scale = scales
    out = paged_decode_attention(
        *fp8, scale=scale, k_scale=k_scale, v_scale=v_scale, interpret=True, **knobs
    )
    ref = paged_decode_attention_reference(*fp8, scale=scale, k_scale=k_scale, v_scale=v_scale)
    check(out, ref, paged_decode_attention_reference(*case, scale=scale), case[2])


@pytest.mark.parametrize(
    "heads, kv_heads, head_dim, block_size, scales, knobs",
    [
        (6, 3, 24, 8, (1.0, 1.0), dict(block_m=16, block_k=16)),
        (5, 1, 80, 16, (1.7, 0.3), dict(block_m=32, block_k=32)),
    ],
)
def test_prefill_reads_an_fp8_pool(heads, kv_heads, head_dim, block_size, scales, knobs):
    rng = np.random.default_rng(heads + head_dim)
    case = prefill.make_case(
        rng, heads=heads, kv_heads=kv_heads, head_dim=head_dim, block_size=block_size
    )
    fp8 = as_fp8(case, *scales)
    scale = head_dim**-0.5
    k_scale, v_scale = scales
    out = paged_prefill_attention(
        *fp8, scale=scale, k_scale=k_scale, v_scale=v_scale, interpret=True, **knobs
    )
    ref = paged_attention_reference(*fp8, scale=scale, k_scale=k_scale, v_scale=v_scale)
    check(out, ref, paged_attention_reference(*case, scale=scale), case[2])
    assert (np.asarray(out)[~case[6]] == 0).all()  # padding tokens are 0


@settings(max_examples=60, deadline=None)
@given(
    x=hnp.arrays(
        np.float32, st.integers(1, 16), elements=st.floats(-1e4, 1e4, width=32, allow_nan=False)
    ),
    scale=st.sampled_from([0.125, 0.5, 1.0, 3.0]),
)
def test_quantize_kv_clips_and_rounds_to_e4m3(x, scale):
    """Dequantized, a stored value is x clipped to +-448 scale, within e4m3's rounding: 2^-4
    relative, or half the smallest subnormal (2^-10) times the scale near 0; never NaN."""
    stored = np.asarray(quantize_kv(jnp.asarray(x), E4M3, scale))
    assert stored.dtype == E4M3
    back = stored.astype(np.float32) * scale
    clipped = np.clip(x, -448 * scale, 448 * scale)
    assert np.all(np.abs(back - clipped) <= 2.0**-4 * np.abs(clipped) + 2.0**-10 * scale)
