"""How a step takes over from the step before it, on the device (asynchronous scheduling: the
host builds step N + 1 before step N's tokens reach it; a synchronous engine's steps take
nothing over, every token source NULL, and run the same program).

What a step carries to the next, per rank (`StepBuffers.carried`):

    row            holds, at each logits column c (C columns: `carried_tokens`)
    -------------  ----------------------------------------------------------------------------
    0              the token sampled at c
    1 .. D         the MTP head's j-th draft of the row whose first logits row is c
                   (`runtime.device.mtp_drafts`); D = 0 without a head
    D + 1 (D > 0)  at each decode lane, how many drafts its row rejected (K - accepted)

A token lane of step N + 1 with source s + 1 takes entry s of rows 0..D, flattened
(`StepBatch.token_sources`). A decode row that chains on a row with K drafts was scheduled as
if all K are accepted; with the last d rejected (`rejected_drafts`, read at the column its first
lane takes its token from) the row moves back by d (`ChainedRows`): its first lane takes the
token sampled at the last accepted lane (d columns earlier), its positions, KV slots, context
length and sample counters drop by d, and it reads the state of the last accepted lane (a
one-token row also writes it in place). Its draft lanes keep their sources: the head drafted
from the last accepted lane already. Rows that may not shift, padding rows and every row of a
step after one without drafts move by 0.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from jmamba.step.pytree import StepInputs
from runtime.core.config import EngineConfig
from runtime.core.sampling_inputs import SamplingInputs
from runtime.core.step_batch import ChainedRows
from runtime.device.kv_addressing import kv_slots_at
from runtime.device.sampler import num_accepted


def carried_depth(num_drafts: int) -> int:
    """Rows of the carried array of a step whose head makes `num_drafts` drafts (table above)."""
    return 1 + num_drafts + (1 if num_drafts else 0)


def carried(
    tokens: jax.Array,
    drafts: jax.Array | None,
    rejected: jax.Array | None,
    shape: tuple[int, int],
) -> jax.Array:
    """What this step hands the next, [depth, C] (module docstring): `tokens` [N] sampled,
    `drafts` [1 + k, N] (the head's count row first; None: a step that drafts nothing, its
    rows zero) and `rejected` [N] (None: an engine without a head). A draft model's wider
    buckets feed nothing past C."""
    depth, width = shape
    n = min(tokens.shape[0], width)
    num_drafts = depth - 1 - (rejected is not None)
    rows = [tokens[:n]]
    for j in range(1, 1 + num_drafts):
        if drafts is not None and j < drafts.shape[0]:
            rows.append(drafts[j, :n])
        else:  # a draft the head did not make this step
            rows.append(jnp.zeros(n, tokens.dtype))
    if rejected is not None:
        rows.append(rejected[:n])
    return jnp.pad(jnp.stack(rows), ((0, 0), (0, width - n)))


def rejected_drafts(accepted: jax.Array, inputs: StepInputs) -> jax.Array:
    """[N] int32 per logits row: how many of its decode row's drafts were rejected (K minus the
    leading accepted ones; `sampler.accept_drafts`), at every lane of the row; 0 for prefill
    and padding rows."""
    rows, width = inputs.decode.num_rows, inputs.decode.width
    num_drafts = jnp.maximum(inputs.decode.query_lens - 1, 0)
    rejected = num_drafts - num_accepted(accepted, inputs)
    per_lane = jnp.broadcast_to(rejected[:, None], (rows, width))
    return jnp.pad(per_lane.reshape(-1), (0, accepted.shape[0] - rows * width))


def follow(
    inputs: StepInputs,
    sampling: SamplingInputs,
    token_sources: jax.Array,
    chained: ChainedRows | None,
    previous: jax.Array,
    block_size: int,
) -> tuple[StepInputs, SamplingInputs]:
    """This step's inputs once the previous step's carried array `previous` [depth, C] is
    known (module docstring): rows moved back where `chained` says they may (None: an engine
    without a head, nothing moves), then every lane with a source takes its token.
    `block_size`: tokens per KV block (a row without blocks, of a model without attention,
    keeps NULL KV slots)."""
    if chained is not None:
        shift = _shift(inputs, token_sources, chained, previous[-1])
        inputs, sampling = _moved_back(inputs, sampling, chained, shift, block_size)
        first_lanes = _first_lane(inputs.decode.width) * shift[:, None]
        token_sources = token_sources - _over(first_lanes, token_sources.shape[0])
        previous = previous[:-1]
    taken = previous.reshape(-1)[jnp.maximum(token_sources - 1, 0)]
    token_ids = jnp.where(token_sources > 0, taken, inputs.token_ids)
    return dataclasses.replace(inputs, token_ids=token_ids), sampling


def _first_lane(width: int) -> jax.Array:
    """[1, W] True at lane 0 of a decode row."""
    return jnp.arange(width)[None, :] == 0


def _shift(
    inputs: StepInputs, token_sources: jax.Array, chained: ChainedRows, rejected: jax.Array
) -> jax.Array:
    """[R_d] how far each decode row moves back: the rejected drafts at the column its first
    lane takes its token from, where it may shift; else 0."""
    decode = inputs.decode
    source = token_sources[: decode.num_rows * decode.width].reshape(-1, decode.width)[:, 0]
    column = jnp.maximum(source - 1, 0)
    return jnp.where(chained.may_shift & (source > 0), rejected[column], 0)


def _moved_back(
    inputs: StepInputs,
    sampling: SamplingInputs,
    chained: ChainedRows,
    shift: jax.Array,
    block_size: int,
) -> tuple[StepInputs, SamplingInputs]:
    """The decode rows moved back by `shift` (positions, KV slots, context lengths, slots,
    sample counters); prefill rows and padding unchanged. Token-level fields change by a
    per-token amount padded over the prefill tokens, never by a scatter into them: XLA's CPU
    compiler crashed (a segfault, jax 0.11.2) compiling `.at[:lanes].set` of the positions in
    a two-rank step."""
    decode = inputs.decode
    rows, width = decode.num_rows, decode.width
    live = jnp.arange(width)[None, :] < decode.query_lens[:, None]
    back = jnp.where(live, shift[:, None], 0)  # [R_d, W]
    back_tokens = _over(back, inputs.num_tokens)
    positions = inputs.positions - back_tokens
    lanes = positions[: rows * width].reshape(rows, width)
    moved = _over(kv_slots_at(decode.block_table, lanes, block_size), inputs.num_tokens)
    kv_slots = jnp.where(back_tokens > 0, moved, inputs.kv_slots)
    fallback = jnp.take_along_axis(chained.fallback_slots, shift[:, None], axis=1)[:, 0]
    moves = shift > 0
    in_place = moves & (decode.write_slots[:, 0] == decode.read_slots)
    rewritten = _first_lane(width) & in_place[:, None]
    decode = dataclasses.replace(
        decode,
        seq_lens=decode.seq_lens - shift,
        read_slots=jnp.where(moves, fallback, decode.read_slots),
        write_slots=jnp.where(rewritten, fallback[:, None], decode.write_slots),
    )
    inputs = dataclasses.replace(inputs, positions=positions, kv_slots=kv_slots, decode=decode)
    counters = sampling.counters - _over(back, sampling.counters.shape[0])
    return inputs, sampling._replace(counters=counters)


def _over(per_lane: jax.Array, size: int) -> jax.Array:
    """[R_d, W] per decode lane -> [size] per token (or logits row): decode lanes first, zeros
    after them."""
    flat = per_lane.reshape(-1)
    return jnp.pad(flat, (0, size - flat.shape[0]))


def carried_tokens(config: EngineConfig) -> int:
    """C, the tokens a step hands to the next on the device: the most logits rows of a bucket
    of `config` (a draft model's runner runs wider buckets, whose rows past C are never fed:
    only an asynchronous step feeds tokens, and it has no drafts)."""
    spec = config.speculative
    width = 1 if spec is None else spec.width
    return max(config.decode_row_buckets) * width + max(config.prefill_row_buckets)
