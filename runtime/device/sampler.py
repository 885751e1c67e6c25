"""Token sampling on device, inside the jitted step: presence / frequency / repetition penalties,
greedy, temperature, top-k, top-p, seeds, masking of the stop tokens of rows short of their
`min_tokens` and of the tokens a row's grammar does not allow (the packed `allowed` bitmask, an
input of every engine step); and, when a step asks for them, log-probabilities (`logprobs`, of
the raw logits).

Each row draws with its own key `fold_in(key(seed), counter)` where `counter` is the index of the
token being generated, so a request's random stream depends on nothing else in the batch. Sampling
is Gumbel-max over the filtered, temperature-scaled logits. What runs is fixed by the static
`SamplingMode` the host decided for the step (the penalties only if some row is penalized, the mask
only if some row masks, the random draw only if some row samples, the sort only if some sampled row
filters): no branch waits on the device.

Speculative decode rows (`accept_drafts`): lane t's token is sampled exactly as above (its counter
is the output index it would produce) and the draft d that lane t + 1 fed is accepted iff the
token equals d. For a greedy row that is the exact-match rule. For a sampled row it is rejection
sampling with a deterministic draft (ngram lookup, a greedy draft model): the Gumbel-max token
equals d with probability p(d), so d is accepted with probability p(d), and when it is not, the
token is distributed as p restricted to the other tokens, renormalised: the residual
distribution. Every output token thus follows the target distribution, and because the draw uses
the request's own (seed, output index) stream, a sampled request gets the same tokens with or
without drafts.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from jmamba.step.pytree import StepInputs
from runtime.core.sampling_inputs import (
    PenaltyInputs,
    SamplingInputs,
    SamplingMode,
    TokenLogprobs,
)

# A field of the step's inputs (`SamplingInputs`, `PenaltyInputs`, `StepInputs`): typed as the
# host builds it (numpy), a traced array inside the step.
InputArray = jax.Array | np.ndarray


def sample(
    logits: jax.Array,
    params: SamplingInputs,
    mode: SamplingMode,
    fed: InputArray | None = None,
) -> jax.Array:
    """Pick one token per row.

    Args:
      logits: [N, vocab] float32.
      params: `SamplingInputs` with [N] fields (and [N, M] `masked_ids`, [N, P] penalty tables).
      mode: static; must be `SamplingMode.of(params)` (or a superset of what the rows need).
      fed: [N] int32 the token each logits row was fed (`fed_tokens`), counted as one more
        output where `params.penalties.pending`; None when no row's is pending.
    Returns:
      [N] int32 token ids (argmax of the penalized, masked logits for rows with temperature 0).
    """
    if mode.penalty_width:
        if params.penalties is None:
            raise ValueError(f"a step of penalty_width={mode.penalty_width} has no penalty tables")
        logits = penalize(logits, params.penalties, fed)
    if mode.mask_width:
        logits = _mask(logits, params.masked_ids, params.num_masked)
    if params.allowed is not None:
        logits = apply_bitmask(logits, params.allowed)
    greedy = jnp.argmax(logits, axis=-1).astype(jnp.int32)
    if not mode.sampled:
        return greedy
    is_greedy = params.temperature <= 0.0
    temperature = jnp.where(is_greedy, 1.0, params.temperature)
    scaled = logits / temperature[:, None]
    if mode.filtered:
        scaled = _filter_top_k_top_p(scaled, params.top_k, params.top_p)
    keys = jax.vmap(lambda s, c: jax.random.fold_in(jax.random.key(s), c))(
        params.seeds, params.counters
    )
    gumbel = jax.vmap(lambda k: jax.random.gumbel(k, logits.shape[-1:], jnp.float32))(keys)
    sampled = jnp.argmax(scaled + gumbel, axis=-1).astype(jnp.int32)
    return jnp.where(is_greedy, greedy, sampled)


def fed_tokens(inputs: StepInputs) -> InputArray:
    """[N] int32 the token each logits row was fed (after an asynchronous step's token sources
    are applied): the penalties count a pending one as an output."""
    return inputs.token_ids[inputs.logits_indices]


def penalize(
    logits: jax.Array, penalties: PenaltyInputs, fed: InputArray | None = None
) -> jax.Array:
    """Rows' logits after their repetition, then frequency and presence penalties (vLLM's order).

    A token the row's prompt or outputs hold has its logit divided by the repetition penalty
    when positive, multiplied by it otherwise; then every token loses frequency x its output
    count and presence x (count > 0). Rows without penalties come back bit for bit.
    """
    rows = jnp.arange(logits.shape[0])
    # Scatter-adds, so padding columns (id 0 adding count 0, not in the prompt) change nothing.
    counts = _row_histogram(logits.shape, penalties.token_ids, penalties.output_counts)
    if fed is not None:
        counts = counts.at[rows, fed].add(penalties.pending.astype(jnp.int32))
    in_prompt = _row_histogram(logits.shape, penalties.token_ids, penalties.in_prompt) > 0
    seen = in_prompt | (counts > 0)
    repetition = penalties.repetition[:, None]
    repeated = jnp.where(logits > 0, logits / repetition, logits * repetition)
    penalized = jnp.where(seen, repeated, logits)
    penalized -= penalties.frequency[:, None] * counts.astype(logits.dtype)
    penalized -= penalties.presence[:, None] * (counts > 0).astype(logits.dtype)
    # Rows without penalties keep their logits exactly (no x / 1.0 or - 0.0 rounding question).
    neutral = (penalties.repetition == 1.0) & (penalties.frequency == 0) & (penalties.presence == 0)
    return jnp.where(neutral[:, None], logits, penalized)


def _row_histogram(shape: tuple[int, ...], ids: InputArray, weights: InputArray) -> jax.Array:
    """[N, vocab] int32: each row's `weights` [N, P] summed at its `ids` [N, P]."""
    rows = jnp.arange(shape[0])[:, None]
    return jnp.zeros(shape, jnp.int32).at[rows, ids].add(weights.astype(jnp.int32))


def logprobs(logits: jax.Array, tokens: jax.Array, width: int) -> TokenLogprobs[jax.Array]:
    """Log-probabilities of the model's raw next-token distribution (log-softmax of `logits`,
    before temperature, filtering and masking): of `tokens` [N] and of each row's top `width`."""
    log_probs = jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1)
    sampled = jnp.take_along_axis(log_probs, tokens[:, None], axis=-1)[:, 0]
    top_logprobs, top_ids = jax.lax.top_k(log_probs, min(width, logits.shape[-1]))
    return TokenLogprobs(sampled, top_ids.astype(jnp.int32), top_logprobs)


def accept_drafts(tokens: jax.Array, inputs: StepInputs) -> jax.Array:
    """[N] bool per logits row: a live decode lane whose token equals the draft the next lane of
    its row fed (see the module docstring); False for the last live lane and prefill rows."""
    rows, width = inputs.decode.num_rows, inputs.decode.width
    lanes = tokens[: rows * width].reshape(rows, width)
    fed = inputs.token_ids[: rows * width].reshape(rows, width)
    has_draft = jnp.arange(1, width)[None, :] < inputs.decode.query_lens[:, None]
    accepted = has_draft & (lanes[:, :-1] == fed[:, 1:])
    flat = jnp.pad(accepted, ((0, 0), (0, 1))).reshape(-1)
    return jnp.pad(flat, (0, tokens.shape[0] - rows * width))


def num_accepted(accepted: jax.Array, inputs: StepInputs) -> jax.Array:
    """[R_d] int32 each decode row's accepted drafts: the leading lanes whose flag
    (`accept_drafts`) is set; 0 for padding rows."""
    rows, width = inputs.decode.num_rows, inputs.decode.width
    flags = accepted[: rows * width].reshape(rows, width).astype(jnp.int32)
    return jnp.cumprod(flags, axis=1).sum(axis=1)


def apply_bitmask(logits: jax.Array, allowed: InputArray) -> jax.Array:
    """`logits` [N, V] with every token its row's bitmask `allowed` [N, ceil(V / 32)] int32 does
    not allow (bit i of word w: token 32 w + i) set to -inf; all-ones rows come back bit for
    bit."""
    vocab = logits.shape[-1]
    bits = jnp.arange(32, dtype=jnp.int32)
    unpacked = (allowed[:, :, None] >> bits[None, None, :]) & 1  # arithmetic shift: bit 31 too
    is_allowed = unpacked.reshape(allowed.shape[0], -1)[:, :vocab] != 0
    return jnp.where(is_allowed, logits, -jnp.inf)


def _mask(logits: jax.Array, masked_ids: InputArray, num_masked: InputArray) -> jax.Array:
    """Set to -inf the first `num_masked[r]` ids of `masked_ids[r]` in row r."""
    rows = jnp.arange(logits.shape[0])[:, None]
    live = jnp.arange(masked_ids.shape[1])[None, :] < num_masked[:, None]
    # A scatter-add of 0/1 counts: repeated ids (and the dead entries, id 0 with 0 added) are
    # harmless, unlike a scatter-set whose duplicate targets XLA leaves undefined.
    hits = jnp.zeros(logits.shape, jnp.int32).at[rows, masked_ids].add(live.astype(jnp.int32))
    return jnp.where(hits > 0, -jnp.inf, logits)


def _filter_top_k_top_p(logits: jax.Array, top_k: InputArray, top_p: InputArray) -> jax.Array:
    """Set to -inf every logit outside the row's top-k and its top-p nucleus."""
    vocab = logits.shape[-1]
    ordered = jnp.sort(logits, axis=-1)[:, ::-1]
    rank = jnp.arange(vocab)[None, :]
    k = jnp.where(top_k > 0, jnp.minimum(top_k, vocab), vocab)[:, None]
    probs = jax.nn.softmax(ordered, axis=-1)
    mass_before = jnp.cumsum(probs, axis=-1) - probs
    # rank 0 is always kept; a row with top_p = 1 keeps its whole tail even where the float sum of
    # its probabilities reaches 1 early, so it samples the same with or without filtering rows
    # beside it (batch invariance).
    keep = (rank < k) & ((top_p[:, None] >= 1.0) | (mass_before < top_p[:, None]))
    threshold = jnp.min(jnp.where(keep, ordered, jnp.inf), axis=-1, keepdims=True)
    return jnp.where(logits >= threshold, logits, -jnp.inf)
