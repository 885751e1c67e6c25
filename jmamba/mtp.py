"""`MTPHead`: the multi-token-prediction head that Qwen3-Next, Qwen3.5 and Nemotron 3 checkpoints
ship beside the model (`mtp.*` tensors), a one-layer draft model fed by the target's hidden states.

At token lane t (position p, token x_p) the head reads the target's final-normed hidden state h_p
and the token after it, x_(p+1), and predicts x_(p+2):

    e   = norm_e(embed(x_(p+1)))                 the target's embedding table, its own norm
    g   = norm_h(h_p)
    y   = [e | g] W_fuse                         [2 hidden] -> [hidden]
    y   = layers(y)                              attention (+ FFN) layers, causal over the head's
                                                 own KV cache at the target's block tables
    m_p = norm_out(y)                            logits: the target's LM head on m_p

Drafting past the known tokens chains the head on itself: the position after p is fed the draft
d and m_p as its hidden state (`runtime.device.mtp_drafts`). Its KV cache holds one entry per
position, written where the target's attention writes its own (same block, same offset), so a
prefix-cache hit on the target's blocks is a hit on the head's too; a request's entry at position
p depends on x_(p+1), which the block's hash does not cover, so on a hit the entry at the last
cached position may be another request's (a worse draft, never a wrong token: drafts are verified).

Layout of the head's caches, after the model's own (`HybridLM.init_caches`):
    one `KVCache` per attention layer of `ModelConfig.mtp_mixers`, [num_blocks, block_size,
    kv_heads, head_dim], block 0 NULL; None for a layer without a mixer.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from jmamba.config import ModelConfig
from jmamba.layer import Layer, LayerCache
from jmamba.layers.linear import Linear
from jmamba.layers.norms import RMSNorm
from jmamba.mixers.token_layout import prefill_token_rows
from jmamba.step.pytree import NextTokens, StepInputs


class MTPHead(nnx.Module):
    """The head's parameters (see the module docstring): `embedding_norm`, `hidden_norm`, `fuse`
    ([2 hidden, hidden]), `layers` (`ModelConfig.mtp_mixers` / `mtp_ffns`) and `norm`."""

    def __init__(self, config: ModelConfig, *, rngs: nnx.Rngs):
        hidden = config.hidden_size
        norm = lambda: RMSNorm(hidden, config.norm_eps, config.norm_offset)  # noqa: E731
        self.embedding_norm = norm()
        self.hidden_norm = norm()
        self.fuse = Linear(2 * hidden, hidden, rngs=rngs)
        self.layers = nnx.List(
            [
                Layer(config, m, f, rngs=rngs)
                for m, f in zip(config.mtp_mixers, config.mtp_ffns, strict=True)
            ]
        )
        self.norm = norm()

    def __call__(
        self,
        hidden: jax.Array,
        embeddings: jax.Array,
        caches: tuple[LayerCache, ...],
        inputs: StepInputs,
    ) -> tuple[jax.Array, tuple[LayerCache, ...]]:
        """hidden [T, hidden] final-normed, embeddings [T, hidden] of each lane's next token ->
        the normed output m [T, hidden] and the head's new caches."""
        fused = jnp.concatenate([self.embedding_norm(embeddings), self.hidden_norm(hidden)], -1)
        x = self.fuse(fused)
        new_caches = []
        for layer, cache in zip(self.layers, caches, strict=True):
            with jax.named_scope("mtp"):
                x, cache = layer(x, cache, inputs, embeddings)
            new_caches.append(cache)
        return self.norm(x), tuple(new_caches)


def next_token_ids(inputs: StepInputs, following: NextTokens, sampled: jax.Array) -> jax.Array:
    """[T] int32, the token after each token lane's: the token this step sampled from the lane's
    logits for a decode lane (for lanes past the accepted drafts a token the host discards) and
    for the last token of a prefill row that samples; the next lane's token inside a prefill row;
    the host's next prompt token after a prefill chunk that does not end the known tokens; 0 for
    padding. `sampled` [N]: the step's token per logits row."""
    num_decode = inputs.num_decode_tokens
    decode_next = sampled[:num_decode]
    rows, live = prefill_token_rows(inputs)  # [T_p] each prefill token's row
    rows = rows.astype(jnp.int32)
    prefill_ids = inputs.token_ids[num_decode:]
    following_lane = jnp.concatenate([prefill_ids[1:], jnp.zeros(1, prefill_ids.dtype)])
    index = jnp.arange(prefill_ids.shape[0], dtype=jnp.int32)
    is_last = index + 1 == inputs.prefill.query_start_loc[rows + 1]
    row_samples = sampled[num_decode + rows]
    row_next = jnp.where(following.samples[rows], row_samples, following.token_ids[rows])
    prefill_next = jnp.where(is_last, row_next, following_lane)
    return jnp.concatenate([decode_next, jnp.where(live, prefill_next, 0)]).astype(jnp.int32)
