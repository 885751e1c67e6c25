"""The MTP head (`jmamba.mtp`) against the fixtures tests/reference/mtp_runs.py recorded with
transformers' own Qwen3-Next / Qwen3.5 decoder layers and norms (tests/reference/README.md, "MTP
fixtures"): the head's normed output and logits over a whole sequence, and the chained drafts
`runtime.device.mtp_drafts` makes past its end."""

from __future__ import annotations

import dataclasses

from pathlib import Path

import jax.numpy as jnp
import numpy as np
import pytest

from jmamba.inputs import NextTokens
from jmamba.model import rows_or_zeros
from jmamba.mtp import next_token_ids
from jmamba.prefill import prefill_inputs
from jmamba.weights import load_pretrained
from runtime.device.mtp_drafts import MTPDrafts

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
FAMILIES = ["qwen3_next_mtp", "qwen3_5_mtp"]
BLOCK = 16


def _run(family: str):
    model = load_pretrained(FIXTURES / family, "float32")
    expected = dict(np.load(FIXTURES / family / "expected.npz"))
    tokens = expected["tokens"]
    n = tokens.size
    width = -(-(n + 8) // BLOCK)  # blocks past the sequence's end, for the chained drafts
    caches = model.init_caches(num_blocks=1 + width, block_size=BLOCK, num_slots=2)
    inputs = prefill_inputs(tokens, block_size=BLOCK, max_blocks=width)
    table = np.arange(1, width + 1, dtype=np.int32)[None]
    inputs = dataclasses.replace(
        inputs, prefill=dataclasses.replace(inputs.prefill, block_table=table)
    )
    return model, expected, inputs, caches


@pytest.mark.parametrize("family", FAMILIES)
def test_head_matches_transformers_layers(family):
    """Target hidden states, then the head over every position fed the next token: its normed
    output and logits equal those of the head built from transformers' modules."""
    model, expected, inputs, caches = _run(family)
    x, caches = model.hidden_states(inputs, caches)
    hidden = model.final_norm(x)
    np.testing.assert_allclose(hidden, expected["hidden"], atol=1e-5, rtol=1e-5)
    next_ids = jnp.asarray(np.append(expected["tokens"][1:], 0), jnp.int32)
    out, _ = model.mtp_hidden(hidden, next_ids, inputs, caches)
    n = expected["mtp_hidden"].shape[0]
    np.testing.assert_allclose(out[:n], expected["mtp_hidden"], atol=1e-5, rtol=1e-5)
    logits = model.head_logits(out[:n])
    np.testing.assert_allclose(logits, expected["mtp_logits"], atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("family", FAMILIES)
def test_chained_drafts_match_transformers_layers(family):
    """The device drafter's four drafts after the sequence's last token (fed the target's greedy
    token there) are the reference's chain, with the blocks the row holds past its end."""
    model, expected, inputs, caches = _run(family)
    x, caches = model.hidden_states(inputs, caches)
    logits = model.logits(rows_or_zeros(x, inputs.logits_indices))
    sampled = jnp.argmax(logits, axis=-1).astype(jnp.int32)
    assert int(sampled[0]) == int(expected["chain_next"])
    following = NextTokens(np.zeros(1, np.int32), np.ones(1, bool))
    accepted = jnp.zeros_like(sampled)
    drafts, _ = MTPDrafts(4)(model, x, sampled, accepted, inputs, following, caches)
    assert drafts.shape == (5, 1)
    assert int(drafts[0, 0]) == 4
    np.testing.assert_array_equal(np.asarray(drafts[1:, 0]), expected["chain_drafts"])


def test_next_token_ids_follow_each_lane():
    """Inside a prefill row the next lane's token; after a chunk that ends the known tokens the
    step's sample; after one that does not, the host's next prompt token."""
    inputs = prefill_inputs([5, 6, 7], block_size=BLOCK)
    sampled = jnp.asarray([9], jnp.int32)
    ends = NextTokens(np.zeros(1, np.int32), np.ones(1, bool))
    assert next_token_ids(inputs, ends, sampled).tolist() == [6, 7, 9]
    goes_on = NextTokens(np.asarray([8], np.int32), np.zeros(1, bool))
    assert next_token_ids(inputs, goes_on, sampled).tolist() == [6, 7, 8]
