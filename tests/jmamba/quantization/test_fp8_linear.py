"""`Fp8Linear`: its CPU path is the `Linear` of the dequantized kernel, bit for bit (per tensor,
per channel, 128 x 128 and 16 x 24 blocks, on shapes no block divides, fp32 and bf16 inputs).
Its GPU products, each run here too: "w8a8" (`fp8_product`: dynamic activation quantization and
e4m3 dot_generals) equals a numpy computation of the same math within 1e-5 of the output's scale
(the fp32 accumulation order apart), and the fp32 product within FP8's rounding; the weight-only
ones (the kernel interpreted, and XLA's dot of the converted kernel) equal the fp32 product of
the dequantized kernel within one output rounding. Which product the GPU runs is static: the
default, a layer's choice, the batch-invariant switch, blocks the kernel does not take."""

from __future__ import annotations

import math

import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
from flax import nnx

from jmamba.layers import fp8_linear
from jmamba.layers.fp8_linear import (
    Fp8Linear,
    fp8_product,
    gpu_product,
    reference_product,
    scale_shape,
    weight_only_product,
    xla_weight_only_product,
)
from jmamba.layers.invariance import batch_invariant
from jmamba.layers.linear import Linear

E4M3 = ml_dtypes.float8_e4m3fn
BLOCKS = [(0, 0), (0, 1), (128, 128), (16, 24)]
SHAPE = (200, 72)  # in, out: neither a multiple of 128 nor of 16 x 24 blocks


def _expand(scale: np.ndarray, shape: tuple[int, int], block: tuple[int, int]) -> np.ndarray:
    grid = scale
    for axis, (n, side) in enumerate(zip(shape, block, strict=True)):
        grid = np.repeat(grid, side, axis=axis).take(np.arange(n), axis=axis) if side else grid
    return np.broadcast_to(grid, shape)


def _weights(block, seed=0):
    rng = np.random.default_rng(seed)
    entries = (rng.standard_normal(SHAPE) * 100).clip(-448, 448).astype(E4M3)
    scale = rng.uniform(1e-3, 1e-2, scale_shape(*SHAPE, block)).astype(np.float32)
    return entries, scale


def _layer(entries, scale, block) -> Fp8Linear:
    layer = Fp8Linear(*SHAPE, block)
    layer.kernel.set_value(jnp.asarray(entries))
    layer.scale.set_value(jnp.asarray(scale))
    return layer


@pytest.mark.parametrize("dtype", [np.float32, ml_dtypes.bfloat16])
@pytest.mark.parametrize("block", BLOCKS)
def test_cpu_path_is_the_dequantized_linear(block, dtype):
    entries, scale = _weights(block)
    dense = Linear(*SHAPE, rngs=nnx.Rngs(0))
    dequantized = entries.astype(np.float32) * _expand(scale, SHAPE, block)
    dense.kernel.set_value(jnp.asarray(dequantized.astype(dtype)))
    x = jnp.asarray(np.random.default_rng(1).standard_normal((3, 5, SHAPE[0])).astype(dtype))
    ours = np.asarray(_layer(entries, scale, block)(x))
    assert ours.dtype == dtype
    np.testing.assert_array_equal(ours, np.asarray(dense(x)))


def _numpy_fp8_product(x: np.ndarray, entries, scale, block) -> np.ndarray:
    """The GPU path's math in numpy: x quantized per row or per 1 x block-rows group (amax /
    448), each group's e4m3 product exact in float64, times both scales."""
    k, n = entries.shape
    group = block[0] or k
    w = entries.astype(np.float64)
    columns = _expand(scale, (math.ceil(k / group), n), (1, block[1]))
    out = np.zeros((x.shape[0], n))
    for g, start in enumerate(range(0, k, group)):
        part = x[:, start : start + group].astype(np.float32)
        x_scale = np.maximum(np.abs(part).max(-1, keepdims=True) / np.float32(448), 2.0**-126)
        xq = np.clip(part / x_scale, -448, 448).astype(E4M3).astype(np.float64)
        out += (xq @ w[start : start + group]) * x_scale * columns[g]
    return out


@pytest.mark.parametrize("block", BLOCKS)
def test_gpu_path_matches_its_numpy_math(block):
    entries, scale = _weights(block, seed=2)
    x = np.random.default_rng(3).standard_normal((7, SHAPE[0])).astype(np.float32)
    x[2] = 0.0  # an all-zero row: a tiny scale, zero outputs
    ours = np.asarray(fp8_product(jnp.asarray(x), jnp.asarray(entries), scale, block, jnp.float32))
    expected = _numpy_fp8_product(x, entries, scale, block)
    assert np.abs(ours - expected).max() <= 1e-5 * np.abs(expected).max()
    assert not ours[2].any()
    exact = x.astype(np.float64) @ (entries.astype(np.float64) * _expand(scale, SHAPE, block))
    # e4m3 activations (3 mantissa bits): a few percent of the output's scale at most.
    assert np.abs(ours - exact).max() <= 0.05 * np.abs(exact).max()


@pytest.mark.parametrize("dtype", [np.float32, ml_dtypes.bfloat16])
@pytest.mark.parametrize("block", BLOCKS)
@pytest.mark.parametrize("product", [weight_only_product, xla_weight_only_product])
def test_weight_only_products_round_the_exact_product_once(product, block, dtype, monkeypatch):
    monkeypatch.setenv("JMAMBA_KERNELS", "interpret")  # the kernel, not its reference
    entries, scale = _weights(block, seed=4)
    x = np.random.default_rng(5).standard_normal((2, 3, SHAPE[0])).astype(dtype)
    ours = np.asarray(product(jnp.asarray(x), jnp.asarray(entries), scale, block, dtype))
    weight = entries.astype(np.float64) * _expand(scale, SHAPE, block)
    exact = x.astype(np.float64) @ weight
    assert ours.shape == (2, 3, SHAPE[1]) and ours.dtype == dtype
    # fp32: exact products, fp32 sums; bf16: within the output's rounding (2^-8 of its scale)
    # (XLA's dot of blocked scales runs the dequantized bf16 kernel: one more rounding).
    tol = 1e-6 if dtype == np.float32 else 2**-8 * (2 if block[0] else 1)
    assert np.abs(ours - exact).max() <= tol * np.abs(exact).max()


def test_the_gpu_product_is_a_static_choice(monkeypatch):
    """The default is XLA's weight-only dot, which hands scales blocked along K to the kernel;
    a layer may name another; inside batch_invariant() every choice runs the kernel; a block the
    kernel cannot slice along K (24 rows of 200) runs the dequantizing reference."""
    assert fp8_linear.GPU_PRODUCT == "weight_only_xla"
    assert gpu_product("weight_only_xla", 200, (128, 128)) is weight_only_product
    assert gpu_product("weight_only_xla", 100, (128, 128)) is xla_weight_only_product  # one row
    assert gpu_product("weight_only_xla", 200, (24, 24)) is reference_product
    assert gpu_product("weight_only", 200, (128, 128)) is weight_only_product
    assert gpu_product("weight_only_xla", 200, (0, 1)) is xla_weight_only_product
    assert gpu_product("w8a8", 200, (0, 1)) is fp8_product
    assert gpu_product("weight_only", 200, (24, 24)) is reference_product
    assert gpu_product("weight_only", 20, (24, 24)) is weight_only_product  # one K group
    with batch_invariant():
        assert gpu_product("w8a8", 200, (0, 1)) is weight_only_product
        assert gpu_product("weight_only_xla", 200, (128, 128)) is weight_only_product
    with pytest.raises(ValueError, match="product='fp4' must be one of"):
        gpu_product("fp4", 200, (0, 1))  # type: ignore[arg-type]


def test_a_layer_runs_its_gpu_product_on_the_gpu(monkeypatch):
    """On the GPU a layer calls the product `gpu_product` names for it (its own choice, else
    GPU_PRODUCT read at call time); elsewhere the reference."""
    entries, scale = _weights((0, 1))
    layers = {None: _layer(entries, scale, (0, 1)), "w8a8": _layer(entries, scale, (0, 1))}
    layers["w8a8"].product = "w8a8"
    calls = []
    x = jnp.ones((2, SHAPE[0]), jnp.float32)
    monkeypatch.setattr(fp8_linear, "gpu_product", lambda *a: calls.append(a) or reference_product)
    layers[None](x)
    assert not calls  # the CPU: the reference, no choice made
    monkeypatch.setattr(fp8_linear.jax, "default_backend", lambda: "gpu")
    monkeypatch.setattr(fp8_linear, "GPU_PRODUCT", "weight_only_xla")
    for layer in layers.values():
        layer(x)
    assert calls == [("weight_only_xla", SHAPE[0], (0, 1)), ("w8a8", SHAPE[0], (0, 1))]
