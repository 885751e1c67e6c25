"""The MTP head (`jmamba.mtp`) against the fixtures tests/reference/mtp_runs.py recorded with
transformers' own Qwen3-Next / Qwen3.5 decoder layers and norms (Qwen3.5 dense, and MoE with the
head's experts packed as published; tests/reference/README.md, "MTP fixtures"): the head's
normed output and logits over a whole sequence, and the chained drafts
`runtime.device.mtp_drafts` makes past its end."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import jax.numpy as jnp
import numpy as np
import pytest

from jmamba.checkpoints.families.registry import from_hf_config
from jmamba.checkpoints.name_map import tensor_sources
from jmamba.checkpoints.weights import load_pretrained
from jmamba.model import rows_or_zeros
from jmamba.mtp import next_token_ids
from jmamba.step.prefill import prefill_inputs
from jmamba.step.pytree import DecodeRows, NextTokens, PrefillRows, StepInputs
from runtime.device.mtp_drafts import MTPDrafts

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
FAMILIES = ["qwen3_next_mtp", "qwen3_5_mtp", "qwen3_5_moe_mtp"]
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


def _decode_row(tokens: np.ndarray, start: int, width: int) -> StepInputs:
    """One decode row of `tokens` at positions start, start + 1, ... (blocks 1, 2, ... in
    order, as `prefill_inputs` lays them out), no prefill row."""
    n = tokens.size
    positions = np.arange(start, start + n, dtype=np.int32)
    table = np.arange(1, width + 1, dtype=np.int32)[None]
    i32 = lambda *v: np.array(v, np.int32)  # noqa: E731
    return StepInputs(
        token_ids=tokens.astype(np.int32),
        positions=positions,
        kv_slots=(positions // BLOCK + 1) * BLOCK + positions % BLOCK,
        decode=DecodeRows(i32(n), i32(start + n), i32(1), np.full((1, n), 1, np.int32), table),
        prefill=PrefillRows(
            query_start_loc=i32(0),
            num_computed=i32(),
            seq_lens=i32(),
            has_initial_state=np.zeros(0, bool),
            read_slots=i32(),
            write_slots=i32(),
            block_table=np.zeros((0, width), np.int32),
        ),
        logits_indices=np.arange(n, dtype=np.int32),
    )


def test_drafts_after_accepted_lanes_continue_the_heads_context():
    """A prefill chunk that stops 3 tokens short (its next token a prompt token), then a decode
    row of 1 + 3 lanes whose first two drafts were accepted: the row drafts from its third lane,
    over the head's KV of both steps, and gets the reference's chain."""
    model, expected, inputs, caches = _run("qwen3_5_mtp")
    tokens = expected["tokens"]
    n, width = tokens.size, inputs.prefill.block_table.shape[1]
    head = MTPDrafts(4)
    first = prefill_inputs(tokens[: n - 3], block_size=BLOCK, max_blocks=width)
    x, caches = model.hidden_states(first, caches)
    following = NextTokens(np.asarray([tokens[n - 3]], np.int32), np.zeros(1, bool))
    sampled = jnp.zeros(1, jnp.int32)
    _, caches = head(model, x, sampled, jnp.zeros(1, jnp.int32), first, following, caches)
    row = _decode_row(np.append(tokens[n - 3 :], 0), n - 3, width)
    x, caches = model.hidden_states(row, caches)
    # What the target "sampled" after each lane: the next two accepted, then the chain's start.
    sampled = jnp.asarray([tokens[n - 2], tokens[n - 1], expected["chain_next"], 0], jnp.int32)
    accepted = jnp.asarray([1, 1, 0, 0], jnp.int32)
    none = NextTokens(np.zeros(0, np.int32), np.zeros(0, bool))
    drafts, _ = head(model, x, sampled, accepted, row, none, caches)
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


# NemotronH's MTP tensors as a published Nemotron 3 checkpoint lists them (pattern "*E": an
# attention block holding the fusion, then a MoE block holding the final norm), typed from that
# listing; its latent MoE projections (`fc1_latent_proj`, `fc2_latent_proj`) are left out, as
# `moe_latent_size` is refused.
PUBLISHED_NEMOTRON_H_MTP = {
    "mtp.layers.0.eh_proj.weight",
    "mtp.layers.0.enorm.weight",
    "mtp.layers.0.hnorm.weight",
    "mtp.layers.0.norm.weight",
    "mtp.layers.0.mixer.q_proj.weight",
    "mtp.layers.0.mixer.k_proj.weight",
    "mtp.layers.0.mixer.v_proj.weight",
    "mtp.layers.0.mixer.o_proj.weight",
    "mtp.layers.1.final_layernorm.weight",
    "mtp.layers.1.norm.weight",
    "mtp.layers.1.mixer.gate.weight",
    "mtp.layers.1.mixer.gate.e_score_correction_bias",
    "mtp.layers.1.mixer.shared_experts.up_proj.weight",
    "mtp.layers.1.mixer.shared_experts.down_proj.weight",
}


def test_nemotron_h_head_reads_the_published_tensor_names():
    """The NemotronH fixture's config with one MTP layer of blocks ["full_attention", "moe"]:
    the head reads exactly the published names, one up / down pair per routed expert."""
    hf = json.loads((FIXTURES / "nemotron_h" / "config.json").read_text())
    config = from_hf_config(hf | {"num_nextn_predict_layers": 1})
    names = {n for source in tensor_sources(config).values() for n in source.names}
    experts = {
        f"mtp.layers.1.mixer.experts.{e}.{proj}.weight"
        for e in range(hf["n_routed_experts"])
        for proj in ("up_proj", "down_proj")
    }
    assert {n for n in names if n.startswith("mtp.")} == PUBLISHED_NEMOTRON_H_MTP | experts
