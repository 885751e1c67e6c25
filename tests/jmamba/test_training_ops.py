"""The one-row training stand-ins of `scripts/training_ops.py` against the library's references.

The preset's weights were trained through these forms; the references are what serves them.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import jax.numpy as jnp
import numpy as np
import pytest

from pallas_kernels.attention.reference import paged_attention_reference
from pallas_kernels.conv.reference import causal_conv1d_prefill_reference
from pallas_kernels.rows import Rows
from pallas_kernels.ssd.reference import ssd_chunk_scan_reference

_SPEC = importlib.util.spec_from_file_location(
    "training_ops", Path(__file__).parents[2] / "scripts" / "training_ops.py"
)
training_ops = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(training_ops)

T = 48  # three chunks of 16
rng = np.random.default_rng(0)


def normal(*shape) -> jnp.ndarray:
    return jnp.asarray(rng.normal(size=shape), jnp.float32)


def one_row(live: int) -> Rows:
    i32 = lambda a: jnp.asarray(a, jnp.int32)  # noqa: E731
    return Rows(i32([0, live]), i32([0]), jnp.array([False]), i32([0]), i32([1]))


@pytest.mark.parametrize("live", [T, T - 5])
def test_ssd_matches_the_token_scan(live):
    heads, head_dim, groups, state = 6, 5, 3, 7
    rows = one_row(live)
    x, dt, a = normal(T, heads, head_dim), normal(T, heads), -jnp.linspace(0.5, 4.0, heads)
    b, c, pool = (
        normal(T, groups, state),
        normal(T, groups, state),
        jnp.zeros((2, heads, head_dim, state)),
    )
    args = (x, dt, a, b, c, pool, rows)
    kw = dict(D=normal(heads), dt_bias=normal(heads), dt_limit=(0.001, float("inf")), chunk_size=16)
    fast, _ = training_ops.one_row_ssd_scan(*args, **kw)
    reference, _ = ssd_chunk_scan_reference(*args, **kw)
    np.testing.assert_allclose(
        fast, reference, rtol=1e-4, atol=1e-4 * float(jnp.abs(reference).max())
    )


def test_causal_conv_matches_the_reference():
    channels, width = 11, 4
    rows = one_row(T - 3)
    x, weight, bias = normal(T, channels), normal(channels, width), normal(channels)
    args = (x, weight, bias, jnp.zeros((2, channels, width - 1)), rows)
    fast, _ = training_ops.one_row_causal_conv1d(*args, activation="silu")
    reference, _ = causal_conv1d_prefill_reference(*args, activation="silu")
    np.testing.assert_allclose(fast, reference, rtol=1e-5, atol=1e-5)


def test_attention_matches_the_paged_reference():
    heads, kv_heads, head_dim, block = 4, 2, 8, 16
    num_blocks = T // block + 2
    k_cache, v_cache = (
        normal(num_blocks, block, kv_heads, head_dim),
        normal(num_blocks, block, kv_heads, head_dim),
    )
    table = jnp.asarray([[2, 1, 3, 0]], jnp.int32)  # the row's blocks, out of pool order
    positions = jnp.arange(T, dtype=jnp.int32)
    valid = positions < T - 4
    args = (
        normal(T, heads, head_dim),
        k_cache,
        v_cache,
        table,
        jnp.zeros(T, jnp.int32),
        positions,
        valid,
    )
    fast = training_ops.one_row_paged_attention(*args, scale=0.3)
    reference = paged_attention_reference(*args, scale=0.3)
    np.testing.assert_allclose(fast, reference, rtol=1e-5, atol=1e-5)


def test_more_than_one_row_is_refused():
    with pytest.raises(ValueError, match="one prefill row"):
        training_ops.one_row_causal_conv1d(
            normal(T, 3),
            normal(3, 4),
            None,
            jnp.zeros((2, 3, 3)),
            Rows(jnp.asarray([0, 4, T]), None, None, None, None),
        )
