"""Parity with transformers (the independent reference) on tiny random checkpoints of each family.

Fixtures are written by tests/reference/make_fixtures.py under transformers 5.23.0. Our model loads
the same safetensors and must reproduce HF's logits and final states within 1e-4 (fp32): for a full
forward, and for chunked prefill followed by token-by-token decode with the states carried in our
pools at non-trivial slots, with padding rows and tokens in every batch, garbage in every pool entry
a request does not own, and NaN in the NULL slot and block.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

import jax
import numpy as np
import pytest
from flax import nnx

from jmamba.config import Mixer
from jmamba.weights import load_pretrained
from tests.jmamba.steps import Row, build

FIXTURES = Path(__file__).parents[1] / "fixtures"
FAMILIES = ["mamba2", "nemotron_h", "qwen3_next", "qwen3_5", "qwen3_5_moe"]
TOL = 1e-4
BLOCK, MAX_BLOCKS, NUM_BLOCKS, NUM_SLOTS = 16, 6, 16, 8
SLOT_A, SLOT_B = 3, 6
BLOCKS_A, BLOCKS_B = [5, 2, 7, 9, 11], [13, 4]


# Every family through the jnp references; two families again through the Pallas kernels (interpret
# mode on CPU), which checks how the mixers wire the kernels: Mamba2 + attention + MoE, and GDN.
CASES = [(f, "reference") for f in FAMILIES] + [
    ("nemotron_h", "interpret"),
    ("qwen3_next", "interpret"),
]


@contextlib.contextmanager
def kernels(implementation: str):
    """Pick the kernel implementation while the step is traced (`_dispatch` reads it then)."""
    previous = os.environ.get("JMAMBA_KERNELS")
    os.environ["JMAMBA_KERNELS"] = implementation
    try:
        yield
    finally:
        os.environ.pop("JMAMBA_KERNELS")
        if previous is not None:
            os.environ["JMAMBA_KERNELS"] = previous


@pytest.fixture(scope="module", params=CASES, ids=lambda c: f"{c[0]}-{c[1]}")
def family(request):
    name, implementation = request.param
    model = load_pretrained(FIXTURES / name)
    graphdef, params = nnx.split(model)
    jitted = jax.jit(lambda p, c, i: nnx.merge(graphdef, p)(i, c), donate_argnums=1)

    def step(p, c, i):
        with kernels(implementation):
            return jitted(p, c, i)

    expected = dict(np.load(FIXTURES / name / "expected.npz"))
    return model, params, step, expected


def poisoned_caches(model):
    """Pools full of garbage (they are never zeroed on allocation) and NaN in slot 0 / block 0."""
    caches = model.init_caches(num_blocks=NUM_BLOCKS, block_size=BLOCK, num_slots=NUM_SLOTS)
    rng = np.random.default_rng(0)

    def poison(leaf):
        garbage = rng.standard_normal(leaf.shape).astype(leaf.dtype)
        garbage[0] = np.nan
        return jax.numpy.asarray(garbage)

    return jax.tree.map(poison, caches)


def row(seq, start, end, slot, blocks, num_computed=None):
    return Row(
        list(seq[start:end]), start if num_computed is None else num_computed, slot, slot, blocks
    )


def test_full_forward_matches_transformers(family):
    """One prefill step over both sequences (plus padding) gives HF's full-forward logits."""
    model, params, step, exp = family
    a, b = exp["seq_a"], exp["seq_b"]
    inputs = build(
        [],
        [row(a, 0, len(a), SLOT_A, BLOCKS_A), row(b, 0, len(b), SLOT_B, BLOCKS_B)],
        block_size=BLOCK,
        max_blocks=MAX_BLOCKS,
        pad_prefill_rows=1,
        pad_tokens=5,
        all_logits=True,
    )
    logits, _ = step(params, poisoned_caches(model), inputs)
    logits = np.asarray(logits)
    np.testing.assert_allclose(logits[: len(a)], exp["logits_full_a"], atol=TOL, rtol=0)
    np.testing.assert_allclose(
        logits[len(a) : len(a) + len(b)], exp["logits_full_b"], atol=TOL, rtol=0
    )
    assert np.all(logits[len(a) + len(b) :] == logits[len(a) + len(b) :])  # padding stays finite


def run_chunked(model, params, step, a, b):
    """a: prefill [0,32), [32,48), then decode; b: prefill [0,16), then decode. Two rows per step,
    plus a padding row in each section."""
    caches = poisoned_caches(model)
    logits_a, logits_b = [], []

    def run(decode, prefill):
        nonlocal caches
        inputs = build(
            decode,
            prefill,
            block_size=BLOCK,
            max_blocks=MAX_BLOCKS,
            pad_decode_rows=2 - len(decode) + 1,
            pad_prefill_rows=1,
            pad_tokens=3,
        )
        logits, caches = step(params, caches, inputs)
        return np.asarray(logits)

    out = run([], [row(a, 0, 32, SLOT_A, BLOCKS_A), row(b, 0, 16, SLOT_B, BLOCKS_B)])
    logits_a.append(out[-3]), logits_b.append(out[-2])  # last token of each prefill row
    out = run([row(b, 16, 17, SLOT_B, BLOCKS_B)], [row(a, 32, 48, SLOT_A, BLOCKS_A)])
    logits_b.append(out[0]), logits_a.append(out[-2])
    for t in range(48, len(a)):
        decode = [row(a, t, t + 1, SLOT_A, BLOCKS_A)]
        if 17 + t - 48 < len(b):
            decode.append(row(b, 17 + t - 48, 18 + t - 48, SLOT_B, BLOCKS_B))
        out = run(decode, [])
        logits_a.append(out[0])
        if len(decode) == 2:
            logits_b.append(out[1])
    return np.stack(logits_a), np.stack(logits_b), caches


def test_chunked_prefill_then_decode_matches_transformers(family):
    """Chunked prefill + decode through our pools reproduces HF's logits and final states."""
    model, params, step, exp = family
    a, b = exp["seq_a"], exp["seq_b"]
    logits_a, logits_b, caches = run_chunked(model, params, step, a, b)
    # Positions whose logits this schedule produces: chunk ends, then every decoded token.
    pos_a = [31, 47, *range(48, len(a))]
    pos_b = [15, *range(16, len(b))]
    np.testing.assert_allclose(logits_a, exp["logits_chunked_a"][pos_a], atol=TOL, rtol=0)
    np.testing.assert_allclose(logits_b, exp["logits_chunked_b"][pos_b], atol=TOL, rtol=0)
    recurrent = [i for i, m in enumerate(model.config.mixers) if m in (Mixer.MAMBA2, Mixer.GDN)]
    assert recurrent == list(exp["recurrent_layers"])
    for i in recurrent:
        conv, rec = (np.asarray(x) for x in jax.tree.leaves(caches[i]))
        if model.config.mixers[i] == Mixer.GDN:
            rec = rec.transpose(0, 1, 3, 2)  # ours [V, K] per head, HF [K, V]
        for slot, name in ((SLOT_A, "a"), (SLOT_B, "b")):
            # HF keeps the whole kernel window; we keep its last d_conv - 1 inputs.
            np.testing.assert_allclose(conv[slot], exp[f"conv_{name}_{i}"][:, 1:], atol=TOL, rtol=0)
            np.testing.assert_allclose(rec[slot], exp[f"rec_{name}_{i}"], atol=TOL, rtol=0)
        assert np.isnan(conv[0]).all() and np.isnan(rec[0]).all()  # NULL slot never written
