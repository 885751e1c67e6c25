"""FP8 weights stay FP8 in memory (tensor_parallel_size 1): a model loaded from an FP8 checkpoint
holds e4m3 kernels exactly at its plan's layers (the dense projections that are one weight
each), the rest dequantized with the plan's reason (stacked experts, Falcon-H1's folded
multipliers, Zamba2's LoRA-folded shared kernels); its logits equal those of the same weights
dequantized (`fp8_writer`'s reference, what milestone 1 loaded) within 1e-6 on the CPU. And
`quantization="fp8"` on the trained `tiny-stdlib` preset: per-channel e4m3 kernels, held-out
perplexity within 2% of the unquantized model's."""

from __future__ import annotations

import sysconfig
from pathlib import Path

import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from jmamba.checkpoints.weights import load_pretrained
from jmamba.layers.fp8_linear import Fp8Linear
from jmamba.loading import load_model
from tests.jmamba.quantization.fp8_writer import block_fp8, compressed_tensors, write_pair
from tests.jmamba.quantization.test_fp8_loading import _logits

CASES = {
    "qwen3_5_moe": ("qwen3_5_moe", block_fp8(24, 24, packed_experts=True)),
    "nemotron_h": ("nemotron_h", compressed_tensors("channel")),
    "falcon_h1": ("falcon_h1", block_fp8()),
    "zamba2": ("zamba2", block_fp8()),
}
# Why each family keeps some FP8 weights dequantized (a reason the plan must give).
REASONS = {
    "qwen3_5_moe": "a stack of experts",
    "falcon_h1": "a constant multiplier folded in",
    "zamba2": "LoRA adapter folded in",
}
# The held-out files of the preset's corpus (training.json's `heldout_files`), from this Python.
HELDOUT = ("sched.py", "glob.py", "calendar.py")


@pytest.fixture(scope="module")
def pairs(tmp_path_factory) -> dict[str, tuple[Path, Path]]:
    root = tmp_path_factory.mktemp("fp8_model")
    return {case: write_pair(*CASES[case], root / case) for case in CASES}


def _kernel_dtypes(model) -> dict[tuple, jnp.dtype]:
    return {
        p: v.get_value().dtype for p, v in nnx.to_flat_state(nnx.state(model)) if p[-1] == "kernel"
    }


@pytest.mark.parametrize("case", sorted(CASES))
def test_e4m3_kernels_where_the_plan_says(pairs, case):
    fp8, reference = pairs[case]
    model = load_pretrained(fp8)
    plan = model.config.quantization
    planned = {(*path, "kernel") for path, _ in plan.layers}
    assert planned
    e4m3 = {p for p, d in _kernel_dtypes(model).items() if d == jnp.float8_e4m3fn}
    assert e4m3 == planned
    assert all(
        isinstance(m, Fp8Linear) for p, m in nnx.iter_graph(model) if (*p, "kernel") in planned
    )
    if case in REASONS:
        assert any(REASONS[case] in why for _, why in plan.dequantized), plan.dequantized
    if case == "nemotron_h":  # a bf16 model keeps the same kernels in e4m3
        bf16 = load_pretrained(fp8, "bfloat16")
        assert {p for p, d in _kernel_dtypes(bf16).items() if d == jnp.float8_e4m3fn} == planned
        assert load_pretrained(reference).config.quantization.layers == ()


@pytest.mark.parametrize("case", ["falcon_h1", "zamba2"])
def test_logits_equal_the_dequantized_model(pairs, case):
    fp8, reference = pairs[case]
    tokens = np.arange(1, 40) % 50
    ours, theirs = (
        _logits(load_pretrained(fp8), tokens),
        _logits(load_pretrained(reference), tokens),
    )
    assert np.abs(ours - theirs).max() <= 1e-6


def test_unknown_quantization_is_refused():
    with pytest.raises(ValueError, match=r"quantization='int8' must be one of \[None, 'fp8'\]"):
        load_model("tiny-stdlib", quantization="int8")
    with pytest.raises(ValueError, match="needs a checkpoint"):
        load_model("tiny-mamba2", quantization="fp8")


def _heldout_tokens(tokenizer, count: int) -> np.ndarray:
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    text = "\n".join((stdlib / name).read_text()[:2000] for name in HELDOUT)
    return np.asarray(tokenizer.encode(text).ids[:count])


def _perplexity(model, tokens: np.ndarray) -> float:
    logits = _logits(model, tokens[:-1]).astype(np.float64)
    logits -= logits.max(-1, keepdims=True)
    log_probs = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
    return float(np.exp(-log_probs[np.arange(len(tokens) - 1), tokens[1:]].mean()))


def test_dynamic_fp8_keeps_the_stdlib_preset_perplexity():
    plain, tokenizer = load_model("tiny-stdlib")
    quantized, _ = load_model("tiny-stdlib", quantization="fp8")
    plan = quantized.config.quantization
    assert plan.layers and all(block == (0, 1) for _, block in plan.layers)
    assert sum(d == jnp.float8_e4m3fn for d in _kernel_dtypes(quantized).values()) == len(
        plan.layers
    )
    tokens = _heldout_tokens(tokenizer, 600)
    assert len(tokens) == 600
    ours, theirs = _perplexity(quantized, tokens), _perplexity(plain, tokens)
    print(f"held-out perplexity: fp8 {ours:.4f}, fp32 {theirs:.4f}")
    assert theirs < 8  # the preset models this text (a random model: ~257)
    assert abs(ours / theirs - 1) <= 0.02
