"""The MoE layer under `batch_invariant()`: the router's softmax and every sum over experts or
choices run in an order fixed by their sizes, the products through the fixed-tile kernels. Both
routers: the values equal the default path's, and a token's output is bitwise the same alone and
among other tokens (every kernel interpreted, as on a GPU they run compiled)."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from jmamba.layer_configs import MoeConfig
from jmamba.layers import moe
from jmamba.layers.invariance import batch_invariant
from pallas_kernels import ops

ROUTERS = {
    "softmax": MoeConfig(40, 3, 24, 16),  # 40 experts: the softmax's sum runs as a product
    "sigmoid_grouped": MoeConfig(
        8, 2, 24, 16, activation="relu2", router="sigmoid_grouped", n_group=4, topk_group=2
    ),
}


@pytest.mark.parametrize("router", ROUTERS)
def test_a_token_is_routed_and_summed_the_same_alone(router, monkeypatch):
    monkeypatch.setenv("JMAMBA_KERNELS", "interpret")
    layer = moe.MoE(32, ROUTERS[router], rngs=nnx.Rngs(0))
    x = jax.random.normal(jax.random.key(1), (9, 32))
    call = nnx.jit(lambda layer, x: layer(x))  # traced anew per shape and switch setting
    plain = call(layer, x)
    with batch_invariant():
        fixed = nnx.jit(lambda layer, x: layer(x))(layer, x)
        alone = nnx.jit(lambda layer, x: layer(x))(layer, x[4:5])
    np.testing.assert_allclose(np.asarray(fixed), np.asarray(plain), rtol=1e-5, atol=1e-6)
    assert np.asarray(alone[0]).tobytes() == np.asarray(fixed[4]).tobytes()


def test_sums_fold_in_order_or_run_as_a_product(monkeypatch):
    """Up to FOLD_TERMS terms are added in order; more go through the fixed-tile product."""
    products = []
    interpreted = functools.partial(ops.matmul, implementation="interpret")
    monkeypatch.setattr(ops, "matmul", lambda *a, **kw: products.append(1) or interpreted(*a, **kw))
    x = jax.random.normal(jax.random.key(2), (3, moe.FOLD_TERMS + 5, 4))
    for axis, product in ((2, False), (1, True)):
        products.clear()
        with batch_invariant():
            got = moe._sum(x, axis=axis)
        assert bool(products) == product and got.shape[axis] == 1
        np.testing.assert_allclose(got, jnp.sum(x, axis=axis, keepdims=True), rtol=1e-5)
