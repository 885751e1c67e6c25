"""FP8 expert stacks stay e4m3 at load: packed (transformers' `gate_up_proj`) and per-expert
layouts, an odd expert count (6) and hidden size (40), per-block and per-channel scales; the
parameters are the dequantized checkpoint's bit for bit (the CPU product is the dequantizing
reference), a bf16 model's expert stacks take half their bf16 bytes in the runner's accounting,
the GPU product (the interpreted kernel) agrees with the reference, and the layouts we do not
keep (scale blocks straddling the packed gate | up halves) stay dequantized with their reason.
The per-expert layout's logits are checked in test_fp8_loading.py (qwen3_next-fp8,
nemotron_h-modelopt: their experts are FP8 now)."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from jmamba.checkpoints.weights import cast, load_pretrained
from jmamba.layers import fp8_experts
from jmamba.layers.fp8_experts import EXPERT_STACKS
from jmamba.model import HybridLM
from runtime.device.footprint import param_bytes
from tests.jmamba.quantization.fp8_model import dequantized_params
from tests.jmamba.quantization.fp8_writer import block_fp8, compressed_tensors, write_pair

CASES = {
    "packed-8x8": ("qwen3_5_moe_odd", block_fp8(8, 8, packed_experts=True)),
    "per-expert-channel": ("qwen3_5_moe_odd", compressed_tensors("channel")),
    "packed-straddled": ("qwen3_5_moe", block_fp8(24, 24, packed_experts=True)),  # I = 32
}


@pytest.fixture(scope="module")
def pairs(tmp_path_factory) -> dict[str, tuple]:
    root = tmp_path_factory.mktemp("fp8_experts")
    return {case: write_pair(*CASES[case], root / case) for case in CASES}


def _stacks(model: HybridLM) -> dict[tuple, jax.Array]:
    flat = nnx.to_flat_state(nnx.state(model))
    return {p: v.get_value() for p, v in flat if p[-1] in EXPERT_STACKS or "_scale" in str(p[-1])}


@pytest.mark.parametrize("case", ["packed-8x8", "per-expert-channel"])
def test_stacks_stay_e4m3_and_stand_for_the_dequantized_weights(pairs, case):
    fp8, reference = pairs[case]
    model = load_pretrained(fp8)
    plan = model.config.quantization
    assert [p for p, _ in plan.experts] == [("layers", i, "ffn") for i in range(3)]
    assert not [why for _, why in plan.dequantized if "experts" in why]
    stacks = _stacks(model)
    for moe, block in plan.experts:
        for proj in EXPERT_STACKS:
            kernel, scale = stacks[(*moe, proj)], stacks[(*moe, f"{proj}_scale")]
            assert kernel.dtype == jnp.float8_e4m3fn and scale.dtype == jnp.float32
            experts, rows, cols = kernel.shape
            grid = [
                -(-n // side) if side else 1 for n, side in zip((rows, cols), block, strict=True)
            ]
            assert experts == 6 and list(scale.shape) == [6, *grid]
    ours, theirs = dequantized_params(model), dequantized_params(load_pretrained(reference))
    assert ours.keys() == theirs.keys()
    assert [p for p in ours if not np.array_equal(ours[p], theirs[p])] == []


def test_a_bf16_models_expert_stacks_take_half_the_bytes(pairs):
    fp8, _ = pairs["packed-8x8"]
    model = load_pretrained(fp8, "bfloat16")
    cfg = model.config
    plain = dataclasses.replace(cfg, quantization=dataclasses.replace(cfg.quantization, experts=()))
    shapes = nnx.eval_shape(lambda: cast(HybridLM(plain, rngs=nnx.Rngs(0)), "bfloat16"))
    stacks = [v for p, v in _stacks(model).items() if p[-1] in EXPERT_STACKS]
    scales = [v for p, v in _stacks(model).items() if p[-1] not in EXPERT_STACKS]
    entries = sum(v.size for v in stacks)
    assert {v.dtype for v in stacks} == {jnp.dtype(jnp.float8_e4m3fn)}
    saved = 2 * entries - entries - sum(v.size * 4 for v in scales)
    assert param_bytes(shapes) - param_bytes(model) == saved
    assert saved > 0.4 * 2 * entries  # the scales of 8 x 8 blocks cost 1/16 of the e4m3 bytes


def test_the_gpu_product_reads_the_stacks_as_stored(pairs, monkeypatch):
    """With the GPU's product (the kernel, interpreted), a MoE's output is the reference's within
    fp32 rounding (per-channel scales: the kernel takes them; 8-row blocks it does not)."""
    model = load_pretrained(pairs["per-expert-channel"][0])
    moe = model.layers[0].ffn
    x = jnp.asarray(np.random.default_rng(0).standard_normal((7, 40)), jnp.float32)
    want = np.asarray(moe(x))
    calls = []
    kernel = fp8_experts.ops.fp8_grouped_matmul
    monkeypatch.setattr(
        fp8_experts.ops, "fp8_grouped_matmul", lambda *a, **k: calls.append(1) or kernel(*a, **k)
    )
    monkeypatch.setenv("JMAMBA_KERNELS", "interpret")
    monkeypatch.setattr(fp8_experts.jax, "default_backend", lambda: "gpu")
    got = np.asarray(moe(x))
    assert len(calls) == 3  # gate, up, down
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_blocks_straddling_the_packed_halves_stay_dequantized(pairs):
    fp8, reference = pairs["packed-straddled"]
    model = load_pretrained(fp8)
    plan = model.config.quantization
    assert plan.experts == ()
    reasons = {why for path, why in plan.dequantized if path[-1] in EXPERT_STACKS}
    assert reasons == {"a stack of experts whose 24-row scale blocks straddle the packed gate | up"}
    assert {v.dtype for v in _stacks(model).values()} == {jnp.dtype(jnp.float32)}
