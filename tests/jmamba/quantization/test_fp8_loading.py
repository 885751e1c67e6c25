"""FP8 checkpoints load with no flag: per format and family, the model's parameters are those of
the same checkpoint with its weights dequantized in numpy (`fp8_writer`, independent of the
loader), bit for bit, whole (`load_pretrained`, its `Fp8Linear`s' kernels dequantized) and one
tensor-parallel shard at a time (`read_shards`); the logits agree within 1e-6 (the same
parameters: in practice exactly), and stay near transformers' logits of the unquantized fixture,
greedy tokens equal where HF's margin exceeds the quantization error. The refusals: a missing
scale or activation scale, a scale whose blocks do not tile its weight, FP8 tensors without a
quantization_config or of a layer kind we do not read quantized (a conv), e5m2 weights, a scale
beside an unquantized weight."""

from __future__ import annotations

import json
import re

import jax
import numpy as np
import pytest
from flax import nnx

from jmamba.checkpoints.shards import read_shards
from jmamba.checkpoints.weights import load_pretrained
from jmamba.model import HybridLM
from jmamba.step.prefill import prefill_inputs
from tests.jmamba.quantization.fp8_model import dequantized_params, dequantized_shards
from tests.jmamba.quantization.fp8_writer import (
    FIXTURES,
    Format,
    block_fp8,
    compressed_tensors,
    modelopt,
    write_pair,
)

# (family, format): attention, Gated DeltaNet (Qwen3-Next's interleaved qkvz beside a kept ba)
# and Mamba2 projections, MLPs, per-expert and packed MoE experts, the MTP head; blocks that do
# not divide the weights (Mamba2's in_proj has 328 rows; 24 x 24 tiles cut Qwen3.5's 64-row
# packed gate | up inside a block), bf16 scales, per-channel and per-tensor scales with and
# without activation and KV-cache scales.
CASES: dict[str, tuple[str, Format]] = {
    "qwen3_next-fp8": ("qwen3_next", block_fp8()),
    "qwen3_next_mtp-fp8": ("qwen3_next_mtp", block_fp8()),
    "qwen3_5_moe-fp8-packed": (
        "qwen3_5_moe",
        block_fp8(24, 24, packed_experts=True, scale_dtype=np.dtype("bfloat16")),
    ),
    "qwen3_5-ct-channel": ("qwen3_5", compressed_tensors("channel")),
    "nemotron_h-fp8": ("nemotron_h", block_fp8()),
    "nemotron_h-ct-channel": ("nemotron_h", compressed_tensors("channel")),
    "nemotron_h-modelopt": ("nemotron_h", modelopt()),
    "mamba2-ct-tensor": ("mamba2", compressed_tensors("tensor")),
    "falcon_h1-fp8": ("falcon_h1", block_fp8()),  # muP multipliers folded into dequantized weights
    "bamba-modelopt": ("bamba", modelopt()),
    "granite_h-ct-channel": ("granite_h", compressed_tensors("channel")),  # stacked experts
    "zamba2-fp8": ("zamba2", block_fp8()),  # shared blocks with their LoRA adapters folded in
}
LOGITS = ("qwen3_next-fp8", "qwen3_5_moe-fp8-packed", "nemotron_h-modelopt", "mamba2-ct-tensor")
BLOCK = 16
# The parameters the writer never quantizes: norms, convs, SSM parameters, embeddings, lm_head,
# routers.
KEPT_PARAMS = re.compile(r"norm|conv|'A'|'A_log'|'D'|dt_bias|embed|lm_head|router")


def _params(model: HybridLM) -> dict[tuple, np.ndarray]:
    """The model's parameters, an `Fp8Linear`'s as the one kernel it stands for (dequantized, in
    the model's dtype)."""
    return dequantized_params(model)


def _differing(ours: dict, theirs: dict) -> list:
    assert ours.keys() == theirs.keys()
    return sorted(str(p) for p in ours if not np.array_equal(ours[p], theirs[p]))


@pytest.fixture(scope="module")
def pairs(tmp_path_factory) -> dict[str, tuple]:
    """Each case's (fp8 dir, reference dir), written once."""
    root = tmp_path_factory.mktemp("fp8")
    return {case: write_pair(*CASES[case], root / case) for case in CASES}


@pytest.mark.parametrize("case", sorted(CASES))
def test_parameters_are_the_dequantized_weights(pairs, case):
    fp8, reference = pairs[case]
    ours = _params(load_pretrained(fp8))
    assert _differing(ours, _params(load_pretrained(reference))) == []
    original = _params(load_pretrained(FIXTURES / CASES[case][0]))
    changed = _differing(ours, original)  # the quantized weights moved; nothing else did
    assert changed and not [p for p in changed if KEPT_PARAMS.search(p)], changed


@pytest.mark.parametrize("case", ["qwen3_5_moe-fp8-packed", "nemotron_h-ct-channel"])
def test_bfloat16_load_casts_the_dequantized_weights(pairs, case):
    fp8, reference = pairs[case]
    bf16 = _params(load_pretrained(fp8, "bfloat16"))
    assert _differing(bf16, _params(load_pretrained(reference, "bfloat16"))) == []


@pytest.mark.parametrize(
    "case",
    [
        "qwen3_next-fp8",
        "qwen3_5_moe-fp8-packed",
        "nemotron_h-modelopt",
        "mamba2-ct-tensor",
        "granite_h-ct-channel",
    ],
)
def test_shards_are_read_dequantized(pairs, case):
    """Two shards read slice by slice (FP8 slices with the scales of their blocks, or e4m3
    kernels with their scales' slices, dequantized here) equal the reference checkpoint's
    shards."""
    fp8, reference = pairs[case]
    ours, theirs = dequantized_shards(fp8, 2), dict(read_shards(reference, 2))
    assert ours.keys() == theirs.keys()
    bad = [p for p in ours if not all(map(np.array_equal, ours[p], theirs[p]))]
    assert bad == []


def _step(graphdef, state, inputs, caches):
    return nnx.merge(graphdef, state)(inputs, caches)


_jitted_step = jax.jit(_step, static_argnums=0)


def _logits(model: HybridLM, tokens: np.ndarray) -> np.ndarray:
    caches = model.init_caches(
        num_blocks=1 + -(-tokens.size // BLOCK), block_size=BLOCK, num_slots=2
    )
    inputs = prefill_inputs(tokens, block_size=BLOCK, all_logits=True)
    graphdef, state = nnx.split(model)
    return np.asarray(_jitted_step(graphdef, state, inputs, caches)[0])


@pytest.mark.parametrize("case", LOGITS)
def test_logits_and_greedy_tokens(pairs, case):
    fp8, reference = pairs[case]
    expected = np.load(FIXTURES / CASES[case][0] / "expected.npz")
    tokens, hf = expected["seq_a"], expected["logits_full_a"]
    ours = _logits(load_pretrained(fp8), tokens)
    assert np.abs(ours - _logits(load_pretrained(reference), tokens)).max() <= 1e-6
    error = np.abs(ours - hf).max(-1)  # per position
    top2 = np.sort(hf, axis=-1)[:, -2:]
    clear = top2[:, 1] - top2[:, 0] > 2 * error  # HF's margin beats any quantization error
    # FP8's rounding (3 mantissa bits) moves these tiny random models' logits by 6-15% of their
    # spread on average (measured 0.057-0.146), the greedy token at 76-94% of the positions.
    assert np.abs(ours - hf).mean() <= 0.2 * hf.std()
    assert clear.any()
    assert np.array_equal(ours[clear].argmax(-1), hf[clear].argmax(-1))


def _drop(name: str):
    return lambda tensors: {n: t for n, t in tensors.items() if n != name}


def _replace(name: str, value: np.ndarray):
    return lambda tensors: {**tensors, name: value}


_QKVZ = "model.layers.0.linear_attn.in_proj_qkvz"
_CONV = "model.layers.0.linear_attn.conv1d.weight"
_E4M3, _E5M2 = np.dtype("float8_e4m3fn"), np.dtype("float8_e5m2")
REFUSALS = {
    "missing scale": (
        block_fp8(),
        _drop(f"{_QKVZ}.weight_scale_inv"),
        f"FP8 weight {_QKVZ}.weight has no scale tensor {_QKVZ}.weight_scale_inv",
    ),
    "missing activation scale": (
        modelopt(kv_cache=False),
        _drop(f"{_QKVZ}.input_scale"),
        f"FP8 weight {_QKVZ}.weight has no activation scale {_QKVZ}.input_scale",
    ),
    "blocks that do not tile": (  # 32 x 32 scales where the config says 16 x 16 blocks
        block_fp8(),
        _replace(f"{_QKVZ}.weight_scale_inv", np.ones((6, 2), np.float32)),
        f"scale tensor {_QKVZ}.weight_scale_inv has shape [6, 2], but 16x16 blocks of its "
        "weight's [192, 64] need [12, 4]",
    ),
    "fp8 conv": (
        block_fp8(),
        _replace(_CONV, np.zeros((128, 1, 4), _E4M3)),
        f"FP8 tensor {_CONV} of shape [128, 1, 4] is not a layer kind we read quantized",
    ),
    "e5m2": (
        block_fp8(),
        _replace(f"{_QKVZ}.weight", np.zeros((192, 64), _E5M2)),
        f"tensor {_QKVZ}.weight is float8_e5m2",
    ),
    "scale of an unquantized weight": (
        block_fp8(),
        _replace("model.layers.0.linear_attn.in_proj_ba.weight_scale_inv", np.ones((1, 4))),
        "unexpected tensors ['model.layers.0.linear_attn.in_proj_ba.weight_scale_inv']",
    ),
    "kv scales the config does not declare": (
        modelopt(kv_cache=False),
        _replace("model.layers.3.self_attn.k_proj.k_scale", np.asarray(0.02, np.float32)),
        "unexpected tensors ['model.layers.3.self_attn.k_proj.k_scale']",
    ),
}


@pytest.mark.parametrize("case", sorted(REFUSALS))
@pytest.mark.parametrize("loader", ["whole", "shards"])
def test_refusals_name_the_tensor(tmp_path, case, loader):
    fmt, edit, message = REFUSALS[case]
    fp8, _ = write_pair("qwen3_next", fmt, tmp_path, edit)
    load = (
        (lambda d: load_pretrained(d)) if loader == "whole" else (lambda d: dict(read_shards(d, 2)))
    )
    with pytest.raises(ValueError, match=re.escape(message)):
        load(fp8)


def test_float8_tensors_without_a_quantization_config(tmp_path):
    fp8, _ = write_pair("mamba2", compressed_tensors("tensor"), tmp_path)
    config = json.loads((fp8 / "config.json").read_text())
    del config["quantization_config"]
    (fp8 / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match="float8 tensor.* config.json has no quantization_config"):
        load_pretrained(fp8)
