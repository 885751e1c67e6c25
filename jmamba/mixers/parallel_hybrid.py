"""Attention and a Mamba2 mixer side by side on the same input, their outputs summed (Falcon-H1).

    y = attention(x) + mamba2(x)

Each half is the library's own mixer with its own state: the attention half reads and writes the
layer's KV blocks, the Mamba2 half its state slot, so a request needs both (and a prefix-cache hit
needs the KV blocks and the state of the same prefix). Falcon-H1's multipliers on the two outputs
(and on their inputs) are folded into the weights at load time (`jmamba.config.WeightMultipliers`).

Tensor parallelism (not built yet): both halves split by head over `tp` and share one all-reduce.
Attention splits q_proj's columns by query head and k_proj / v_proj's by KV head (the KV cache on
its kv-heads axis; KV heads replicated when there are fewer than `tp`), o_proj's rows by head.
Mamba2 splits in_proj's z, x and dt columns by head and its B, C columns by group (n_groups a
multiple of `tp`, else B and C replicated), the conv channels, A, D and dt_bias likewise,
out_proj's rows by head, and the state's conv channel and head axes. The gated group norm's
weight splits with its groups, which stay on one rank when n_groups is a multiple of `tp`;
otherwise its mean of squares needs a reduction across ranks ("gate_only" has no norm). Each rank
sums its two partial outputs before the one all-reduce of the layer.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
from flax import nnx

from jmamba.config import AttentionConfig, Mamba2Config
from jmamba.inputs import StepInputs
from jmamba.mixers.attention import Attention, KVCache
from jmamba.mixers.mamba2 import Mamba2, Mamba2State


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class ParallelHybridCache:
    """The two states of one parallel hybrid layer.

    Attributes:
      kv: the attention half's paged KV cache (`KVCache`, by block; block 0 is NULL).
      state: the Mamba2 half's conv and SSM state (`Mamba2State`, by slot; slot 0 is NULL).
    """

    kv: KVCache
    state: Mamba2State

    @classmethod
    def zeros(
        cls,
        attention: AttentionConfig,
        mamba2: Mamba2Config,
        *,
        num_blocks: int,
        block_size: int,
        num_slots: int,
        dtype: jnp.dtype,
        state_dtype: jnp.dtype = jnp.float32,
    ) -> ParallelHybridCache:
        return cls(
            KVCache.zeros(attention, num_blocks, block_size, dtype),
            Mamba2State.zeros(mamba2, num_slots, dtype, state_dtype),
        )


class ParallelHybrid(nnx.Module):
    """`(x, cache, inputs) -> (attention(x) + mamba2(x), new cache)`."""

    def __init__(
        self,
        hidden: int,
        attention: AttentionConfig,
        mamba2: Mamba2Config,
        norm_eps: float,
        norm_offset: float,
        *,
        rngs: nnx.Rngs,
    ):
        self.attention = Attention(hidden, attention, norm_eps, norm_offset, rngs=rngs)
        self.mamba2 = Mamba2(hidden, mamba2, norm_eps, rngs=rngs)

    def __call__(
        self, x: jax.Array, cache: ParallelHybridCache, inputs: StepInputs
    ) -> tuple[jax.Array, ParallelHybridCache]:
        # Scopes inside the layer's own, so a profile splits the layer's time between its halves.
        with jax.named_scope("attention"):
            y_attention, kv = self.attention(x, cache.kv, inputs)
        with jax.named_scope("mamba2"):
            y_mamba2, state = self.mamba2(x, cache.state, inputs)
        return y_attention + y_mamba2, ParallelHybridCache(kv, state)
