"""`pack`/`unpack`: one int32 buffer carries every field of a step, bit for bit."""

from __future__ import annotations

import jax
import numpy as np
import pytest

from runtime.core.sampling_inputs import PenaltyInputs, SamplingInputs
from runtime.device.packing import layout_of, pack, unpack
from tests.runtime.core.test_builder import mixed_batch


def test_round_trip_of_a_built_step():
    """Every leaf (int32, bool, float32, uint32) comes back with its shape, dtype and bits, the
    penalty tables' included."""
    _, _, batch = mixed_batch()
    rng = np.random.default_rng(0)
    n = batch.sampling.temperature.shape[0]
    sampling = SamplingInputs(
        rng.random(n, dtype=np.float32),
        rng.integers(0, 50, n).astype(np.int32),
        rng.random(n, dtype=np.float32),
        rng.integers(0, 2**32, n, dtype=np.uint32),  # the high bit set too
        rng.integers(0, 9, n).astype(np.int32),
        rng.integers(0, 50, (n, 4)).astype(np.int32),
        rng.integers(0, 5, n).astype(np.int32),
        PenaltyInputs(
            rng.integers(0, 50, (n, 32)).astype(np.int32),
            rng.integers(0, 9, (n, 32)).astype(np.int32),
            rng.random((n, 32)) < 0.5,
            rng.uniform(-2, 2, n).astype(np.float32),
            rng.uniform(-2, 2, n).astype(np.float32),
            rng.uniform(0.5, 2, n).astype(np.float32),
            rng.random(n) < 0.5,
        ),
    )
    tree = (batch.inputs, sampling)
    layout = layout_of(tree)
    packed = pack(tree, layout)
    assert packed.dtype == np.int32 and packed.shape == (layout.size,)
    back = jax.jit(unpack, static_argnums=1)(packed, layout)
    want, got = jax.tree.leaves(tree), jax.tree.leaves(back)
    assert jax.tree.structure(back) == jax.tree.structure(tree)
    for w, g in zip(want, got, strict=True):
        assert g.dtype == w.dtype and g.shape == w.shape
        np.testing.assert_array_equal(np.asarray(g), w)


def test_pack_rejects_a_leaf_of_another_shape_or_dtype():
    _, _, batch = mixed_batch()
    layout = layout_of(batch.inputs)
    bad = batch.inputs.__class__(
        batch.inputs.token_ids[:-1],
        *jax.tree_util.tree_flatten(batch.inputs)[0][1:3],
        batch.inputs.decode,
        batch.inputs.prefill,
        batch.inputs.logits_indices,
    )
    with pytest.raises(ValueError, match="does not match"):
        pack(bad, layout)
    with pytest.raises(ValueError, match="dtype int64"):
        layout_of(np.zeros(3, np.int64))
