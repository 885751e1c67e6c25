"""An FP8 checkpoint's KV-cache scales reach its attention layers (ModelOpt's
`k_proj.k_scale`, llm-compressor's `self_attn.k_scale`), whole and in the shapes-only load a
tensor-parallel runner uses; an FP8 KV cache stores keys and values divided by them (the pool
times the scale is the unquantized model's keys within e4m3's rounding: this fails if the scales
were ignored) and the logits stay near those of the same weights with an unquantized cache.
vLLM's rules: one scale of the two serves both, the deprecated `kv_scale` serves both, a layer
without scales keeps 1.0, per-head scales are refused."""

from __future__ import annotations

import re

import jax
import numpy as np
import pytest
from flax import nnx

from jmamba.cache_dtypes import CacheDtypes
from jmamba.checkpoints.quantization.kv_scales import kv_scales
from jmamba.checkpoints.quantization.scheme import Fp8Scheme
from jmamba.checkpoints.source import linear
from jmamba.checkpoints.weights import load_pretrained
from jmamba.loading import load_model_shapes
from jmamba.step.prefill import prefill_inputs
from tests.jmamba.quantization.fp8_writer import compressed_tensors, modelopt, write_pair

BLOCK = 16
# (family, format, the attention layer's path and its scale): ModelOpt's names, llm-compressor's.
CASES = {
    "nemotron_h-modelopt": ("nemotron_h", modelopt(), ("layers", 2, "mixer"), 0.02),
    "qwen3_next-ct": (
        "qwen3_next",
        compressed_tensors("channel", 0.0125),
        ("layers", 3, "mixer"),
        0.0125,
    ),
}


@pytest.fixture(scope="module")
def pairs(tmp_path_factory) -> dict[str, tuple]:
    root = tmp_path_factory.mktemp("kv_scales")
    return {case: write_pair(*CASES[case][:2], root / case) for case in CASES}


@pytest.mark.parametrize("case", sorted(CASES))
def test_the_attention_layers_get_the_checkpoints_scales(pairs, case):
    fp8, reference = pairs[case]
    _, _, path, scale = CASES[case]
    expected = ((path, np.float32(scale), np.float32(scale)),)
    model = load_pretrained(fp8)
    assert model.config.quantization.kv_scales == expected
    assert load_model_shapes(fp8)[0].config.quantization.kv_scales == expected
    assert model.layers[path[1]].mixer.kv_scales == expected[0][1:]
    assert load_pretrained(reference).layers[path[1]].mixer.kv_scales == (1.0, 1.0)


def _step(graphdef, state, inputs, caches):
    return nnx.merge(graphdef, state)(inputs, caches)


_jitted_step = jax.jit(_step, static_argnums=0)


def _prefill(model, tokens: np.ndarray, kv_cache: str) -> tuple[np.ndarray, tuple]:
    """Logits of every token and the caches after one prefill of `tokens`."""
    caches = model.init_caches(
        num_blocks=1 + -(-tokens.size // BLOCK),
        block_size=BLOCK,
        num_slots=2,
        dtypes=CacheDtypes(kv_cache),
    )
    inputs = prefill_inputs(tokens, block_size=BLOCK, all_logits=True)
    graphdef, state = nnx.split(model)
    logits, caches = _jitted_step(graphdef, state, inputs, caches)
    return np.asarray(logits), caches


def test_an_fp8_cache_stores_values_divided_by_the_scales(pairs):
    case = "nemotron_h-modelopt"
    fp8, reference = pairs[case]
    _, _, path, scale = CASES[case]
    tokens = np.arange(1, 40) % 50
    ours, caches = _prefill(load_pretrained(fp8), tokens, "fp8")
    theirs, exact = _prefill(load_pretrained(reference), tokens, "auto")
    for pool, values in (
        (caches[path[1]].k, exact[path[1]].k),
        (caches[path[1]].v, exact[path[1]].v),
    ):
        stored = np.asarray(pool[1:], np.float32)  # block 0 is the NULL block
        values = np.asarray(values[1:], np.float32)
        assert np.abs(values).max() > 0.5  # the keys and values are not tiny
        # e4m3's rounding of x / scale: 2^-4 relative, half its smallest subnormal near 0.
        bound = 2.0**-4 * np.abs(values) + 2.0**-10 * scale
        assert (np.abs(stored * np.float32(scale) - values) <= bound).all()
    # Logits: the KV cache's rounding alone (the weights are the same); measured 0.019 of the
    # logits' spread at most and 0.002 on average on this tiny random model.
    error = np.abs(ours - theirs)
    assert error.max() <= 0.05 * theirs.std() and error.mean() <= 0.005 * theirs.std()


def _sources(*prefixes: str) -> dict:
    return {
        ("layers", i, "mixer", "k_proj", "kernel"): linear(f"{p}.k_proj")
        for i, p in enumerate(prefixes)
    }


def test_vllms_rules_for_partial_and_deprecated_scales():
    scheme = Fp8Scheme("compressed-tensors", kv_cache_scales=True)
    tensors = {
        "a.k_proj.output_scale": np.asarray([0.5], np.float32),  # k only: serves both
        "b.kv_scale": np.asarray(0.25, np.float32),  # deprecated: serves both
    }
    found = kv_scales(scheme, _sources("a", "b", "c"), tensors.keys(), tensors.__getitem__)
    mixer = lambda i: ("layers", i, "mixer")  # noqa: E731
    assert found == ((mixer(0), 0.5, 0.5), (mixer(1), 0.25, 0.25))
    undeclared = Fp8Scheme("compressed-tensors")
    assert kv_scales(undeclared, _sources("a"), tensors.keys(), tensors.__getitem__) == ()
    heads = {"a.k_scale": np.ones((4,), np.float32)}
    message = "KV-cache scale a.k_scale has shape [4]: one scale per layer is read"
    with pytest.raises(ValueError, match=re.escape(message)):
        kv_scales(scheme, _sources("a"), heads.keys(), heads.__getitem__)
