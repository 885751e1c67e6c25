"""Drafting inside the step: what runs after sampling to propose the next step's drafts.

A step's device drafter is static (it picks the compiled program) and always present:
`NoDeviceDrafts` (no speculation, a drafter that runs on the host or in its own model, or a step
that drafts nothing) returns nothing; `MTPDrafts(k)` runs the model's MTP head (`jmamba.mtp`) and
returns up to k drafts per scheduled row, which the host hands back as the row's drafts in the
next step. A step of an MTP engine without drafts is the plain step (`NoDeviceDrafts`), so it
costs what a plain engine's step costs: the head's KV cache skips that step's tokens, and when
the row drafts again the head attends to what those positions' slots held. Only the drafts'
acceptance can change, never a token (verification decides); on the trained `tiny-stdlib` head
a request whose prompt and first 16-96 tokens ran without drafts accepted its later drafts
about as often as one whose every step fed the head (benchmarks/results/log/2026-12-05.md).

`MTPDrafts`, per step, after the target sampled (and verified) its lanes:

1. main pass: the head over every token lane of the step, fed the target's final-normed hidden
   state and the token after the lane (`jmamba.mtp.next_token_ids`); it writes its KV at the
   lanes' own KV slots. Lanes past a row's accepted drafts get entries the next step rewrites.
2. each row's base lane: a decode row's last accepted lane (its accepted drafts, counted on the
   device from the accept flags), a prefill row's last token. A row drafts when the token after
   its base lane is this step's sample (decode rows, prefill rows that end their known tokens);
   d_1 = argmax of the head's logits at the base lane.
3. chain passes j = 2..k: one lane per row at position base + j - 1, fed d_(j-1) and the head's
   previous output as its hidden state; its KV goes to that position's slot when the row's block
   table has a block there (the blocks a request holds past its tokens: never a published one),
   else the row stops drafting. d_j = argmax of that pass's logits.

Outputs: [1 + k, N] int32, column c = a row's first logits row (decode row i: i * W; prefill row
j: R_d * W + j): row 0 the number of drafts made (0 for a row that does not draft), rows 1..k the
drafts d_1..d_k (meaningful up to that number).
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from jmamba.mixers.attention import KVCache
from jmamba.model import HybridLM, LayerCache
from jmamba.mtp import next_token_ids
from jmamba.step.pytree import DecodeRows, NextTokens, PrefillRows, StepInputs
from runtime.core.speculative_config import SpeculativeConfig
from runtime.device.kv_addressing import kv_slots_at
from runtime.device.sampler import num_accepted


@dataclasses.dataclass(frozen=True)
class NoDeviceDrafts:
    """The step drafts nothing."""

    num_drafts: int = 0

    def __call__(
        self,
        model: HybridLM,
        x: jax.Array,
        sampled: jax.Array,
        accepted: jax.Array,
        inputs: StepInputs,
        following: NextTokens | None,
        caches: tuple[LayerCache, ...],
    ) -> tuple[jax.Array | None, tuple[LayerCache, ...]]:
        return None, caches


@dataclasses.dataclass(frozen=True)
class MTPDrafts:
    """Up to `num_drafts` drafts per row from the model's MTP head (module docstring)."""

    num_drafts: int

    def __call__(
        self,
        model: HybridLM,
        x: jax.Array,
        sampled: jax.Array,
        accepted: jax.Array,
        inputs: StepInputs,
        following: NextTokens,
        caches: tuple[LayerCache, ...],
    ) -> tuple[jax.Array, tuple[LayerCache, ...]]:
        """x [T, hidden] the target's last layer output, sampled / accepted [N] per logits row
        -> (drafts [1 + k, N], caches)."""
        hidden, caches = _head_pass(model, x, sampled, inputs, following, caches)
        base, drafting = _base_lanes(inputs, accepted, following)
        positions = inputs.positions[base]
        hidden = hidden[base]
        drafts = [_greedy(model, hidden)]
        alive = drafting
        counts = drafting.astype(jnp.int32)
        block_tables = jnp.concatenate([inputs.decode.block_table, inputs.prefill.block_table])
        block_size = _block_size(model, caches)
        for step in range(1, self.num_drafts):
            position = positions + step
            kv_slots = kv_slots_at(block_tables, position, block_size)
            alive = alive & (kv_slots != 0)
            chain = _chain_inputs(drafts[-1], position, kv_slots, alive, block_tables, inputs)
            out, caches = model.mtp_hidden(hidden, drafts[-1], chain, caches)
            hidden = jnp.where(alive[:, None], out, hidden)
            drafts.append(_greedy(model, hidden))
            counts += alive.astype(jnp.int32)
        table = jnp.stack([counts, *drafts])  # [1 + k, R]
        return _by_logits_row(table, inputs), caches


DeviceDrafter = NoDeviceDrafts | MTPDrafts


def _head_pass(
    model: HybridLM,
    x: jax.Array,
    sampled: jax.Array,
    inputs: StepInputs,
    following: NextTokens,
    caches: tuple[LayerCache, ...],
) -> tuple[jax.Array, tuple[LayerCache, ...]]:
    """The head's main pass (module docstring, 1): [T, hidden] its output at every token lane,
    fed the target's final-normed output and the token after each lane; its KV written."""
    next_ids = next_token_ids(inputs, following, sampled)
    return model.mtp_hidden(model.final_norm(x), next_ids, inputs, caches)


def _greedy(model: HybridLM, hidden: jax.Array) -> jax.Array:
    """[R] argmax of the head's logits of normed rows."""
    return jnp.argmax(model.head_logits(hidden), axis=-1).astype(jnp.int32)


def _base_lanes(
    inputs: StepInputs, accepted: jax.Array, following: NextTokens
) -> tuple[jax.Array, jax.Array]:
    """([R] token lane each row drafts from, [R] bool whether it drafts), decode rows then
    prefill rows (module docstring, 2)."""
    rows, width = inputs.decode.num_rows, inputs.decode.width
    decode_base = jnp.arange(rows, dtype=jnp.int32) * width + num_accepted(accepted, inputs)
    decode_drafts = inputs.decode.query_lens > 0
    prefill_base = inputs.logits_indices[rows * width :]
    return (
        jnp.concatenate([decode_base, prefill_base]),
        jnp.concatenate([decode_drafts, following.samples]),
    )


def _block_size(model: HybridLM, caches: tuple[LayerCache, ...]) -> int:
    """Tokens per KV block: axis 1 of the head's first KV cache."""
    head_caches = caches[model.config.num_layers :]
    return next(cache.k.shape[1] for cache in head_caches if isinstance(cache, KVCache))


def _chain_inputs(
    token_ids: jax.Array,
    position: jax.Array,
    kv_slots: jax.Array,
    alive: jax.Array,
    block_tables: jax.Array,
    like: StepInputs,
) -> StepInputs:
    """A decode-only `StepInputs` of R rows of one lane each: row r feeds `token_ids[r]` at
    `position[r]`, writing its KV to `kv_slots[r]`; rows not `alive` are padding (NULL
    everywhere)."""
    live = alive.astype(jnp.int32)
    num_rows = token_ids.shape[0]
    zeros = jnp.zeros(num_rows, jnp.int32)
    decode = DecodeRows(
        query_lens=live,
        seq_lens=(position + 1) * live,
        read_slots=zeros,
        write_slots=zeros[:, None],
        block_table=block_tables * live[:, None],
    )
    empty = jnp.zeros(0, jnp.int32)
    prefill = PrefillRows(
        query_start_loc=jnp.zeros(1, jnp.int32),
        num_computed=empty,
        seq_lens=empty,
        has_initial_state=jnp.zeros(0, bool),
        read_slots=empty,
        write_slots=empty,
        block_table=jnp.zeros((0, like.prefill.block_table.shape[1]), jnp.int32),
    )
    return StepInputs(
        token_ids=token_ids * live,
        positions=position * live,
        kv_slots=kv_slots * live,
        decode=decode,
        prefill=prefill,
        logits_indices=jnp.arange(num_rows, dtype=jnp.int32) * live,
    )


def _by_logits_row(table: jax.Array, inputs: StepInputs) -> jax.Array:
    """[1 + k, R] per row -> [1 + k, N] at each row's first logits row (module docstring)."""
    rows, width = inputs.decode.num_rows, inputs.decode.width
    columns = jnp.concatenate(
        [
            jnp.arange(rows, dtype=jnp.int32) * width,
            rows * width + jnp.arange(inputs.prefill.num_rows, dtype=jnp.int32),
        ]
    )
    out = jnp.zeros((table.shape[0], inputs.logits_indices.shape[0]), jnp.int32)
    return out.at[:, columns].set(table)


def device_drafter(speculative: SpeculativeConfig | None) -> DeviceDrafter:
    """The step's drafter: the MTP head's K drafts under speculative method "mtp", else none."""
    if speculative is not None and speculative.method == "mtp":
        return MTPDrafts(speculative.num_speculative_tokens)
    return NoDeviceDrafts()


def served_model(model: HybridLM, speculative: SpeculativeConfig | None) -> HybridLM:
    """The model an engine runs: without its MTP head unless it drafts with it."""
    return model if device_drafter(speculative).num_drafts else model.without_head()
