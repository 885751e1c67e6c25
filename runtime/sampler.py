"""Token sampling on device, inside the jitted step: greedy, temperature, top-k, top-p, seeds.

Each row draws with its own key `fold_in(key(seed), counter)` where `counter` is the index of the
token being generated, so a request's random stream depends on nothing else in the batch. Sampling
is Gumbel-max over the filtered, temperature-scaled logits. The sort needed by top-k/top-p runs
only when some row asks for it, and the random branch only when some row is not greedy.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from runtime.builder import SamplingInputs


def sample(logits: jax.Array, params: SamplingInputs) -> jax.Array:
    """Pick one token per row.

    Args:
      logits: [N, vocab] float32.
      params: `SamplingInputs` with [N] fields.
    Returns:
      [N] int32 token ids (argmax for rows with temperature 0).
    """
    greedy = jnp.argmax(logits, axis=-1).astype(jnp.int32)
    is_greedy = params.temperature <= 0.0
    sampled = jax.lax.cond(
        jnp.all(is_greedy), lambda: greedy, lambda: _sample_random(logits, params)
    )
    return jnp.where(is_greedy, greedy, sampled)


def _sample_random(logits: jax.Array, params: SamplingInputs) -> jax.Array:
    temperature = jnp.where(params.temperature > 0.0, params.temperature, 1.0)
    scaled = logits / temperature[:, None]
    needs_filter = jnp.any(params.top_k > 0) | jnp.any(params.top_p < 1.0)
    scaled = jax.lax.cond(
        needs_filter, _filter_top_k_top_p, lambda x, *_: x, scaled, params.top_k, params.top_p
    )
    keys = jax.vmap(lambda s, c: jax.random.fold_in(jax.random.key(s), c))(
        params.seeds, params.counters
    )
    gumbel = jax.vmap(lambda k: jax.random.gumbel(k, logits.shape[-1:], jnp.float32))(keys)
    return jnp.argmax(scaled + gumbel, axis=-1).astype(jnp.int32)


def _filter_top_k_top_p(logits: jax.Array, top_k: jax.Array, top_p: jax.Array) -> jax.Array:
    """Set to -inf every logit outside the row's top-k and its top-p nucleus."""
    vocab = logits.shape[-1]
    ordered = jnp.sort(logits, axis=-1)[:, ::-1]
    rank = jnp.arange(vocab)[None, :]
    k = jnp.where(top_k > 0, jnp.minimum(top_k, vocab), vocab)[:, None]
    probs = jax.nn.softmax(ordered, axis=-1)
    mass_before = jnp.cumsum(probs, axis=-1) - probs
    keep = (rank < k) & (mass_before < top_p[:, None])  # rank 0 is always kept
    threshold = jnp.min(jnp.where(keep, ordered, jnp.inf), axis=-1, keepdims=True)
    return jnp.where(logits >= threshold, logits, -jnp.inf)
