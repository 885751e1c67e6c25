"""`prefill_inputs` runs the model alone: on each transformers fixture its logits equal
transformers' full forward, in one call or continued from the caches in a second call."""

from __future__ import annotations

import jax
import numpy as np
import pytest

from jmamba import load_pretrained, prefill_inputs
from jmamba.step.invariants import check_step_inputs
from tests.jmamba.fixture_runs import FIXTURES, ORIGINAL

BLOCK = 16


@pytest.mark.parametrize("name", ORIGINAL)
def test_prefill_inputs_give_transformers_logits(name):
    expected = np.load(FIXTURES / name / "expected.npz")
    tokens, reference = expected["seq_a"].tolist(), expected["logits_full_a"]
    model = load_pretrained(FIXTURES / name)
    chunk = model.config.chunk_size
    split = chunk if chunk < len(tokens) else len(tokens) // 2  # a continuation on a chunk end
    width = -(-len(tokens) // BLOCK)
    run = jax.jit(lambda inputs, caches: model(inputs, caches))
    caches = model.init_caches(num_blocks=width + 1, block_size=BLOCK, num_slots=3)
    whole = prefill_inputs(tokens, block_size=BLOCK, slot=2, all_logits=True)
    last_only = prefill_inputs(tokens, block_size=BLOCK, slot=2)  # what the runtime would build
    check_step_inputs(
        last_only, block_size=BLOCK, chunk_size=chunk, num_blocks=width + 1, num_slots=3
    )
    logits, _ = run(whole, caches)
    np.testing.assert_allclose(np.asarray(logits), reference, atol=1e-4, rtol=0)
    caches = model.init_caches(num_blocks=width + 1, block_size=BLOCK, num_slots=3)
    first = prefill_inputs(tokens[:split], block_size=BLOCK, slot=2, max_blocks=width)
    rest = prefill_inputs(
        tokens[split:], block_size=BLOCK, slot=2, start=split, max_blocks=width, all_logits=True
    )
    _, caches = run(first, caches)
    logits, _ = run(rest, caches)
    np.testing.assert_allclose(np.asarray(logits), reference[split:], atol=1e-4, rtol=0)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(token_ids=[]), "token_ids must be a non-empty flat list"),
        (dict(token_ids=[1], slot=0), "slot=0 must be >= 1"),
        (dict(token_ids=[1] * 40, max_blocks=2), "max_blocks=2 is below the 3 blocks"),
    ],
)
def test_bad_arguments_are_named(kwargs, message):
    with pytest.raises(ValueError, match=message):
        prefill_inputs(**kwargs)
