"""Attention and a Mamba2 mixer side by side on the same input, their outputs summed (Falcon-H1).

    y = attention(x) + mamba2(x)

Each half is the library's own mixer with its own state: the attention half reads and writes the
layer's KV blocks, the Mamba2 half its state slot, so a request needs both (and a prefix-cache hit
needs the KV blocks and the state of the same prefix). Falcon-H1's multipliers on the two outputs
(and on their inputs) are folded into the weights at load time
(`jmamba.multipliers.WeightMultipliers`).

Tensor parallelism: both halves split by head over `tp` as they do alone
(`attention_tp_rules`, `mamba2_tp_rules`) and share one all-reduce: each shard returns the sum of
its two partial outputs and the layer (`jmamba.model.Layer`) all-reduces it once.
"""

from __future__ import annotations

import dataclasses
from typing import Generic

import jax
import jax.numpy as jnp
from flax import nnx
from typing_extensions import TypeVar

from jmamba.layer_configs import AttentionConfig, Mamba2Config
from jmamba.mixers.attention import Attention, KVCache, attention_tp_rules
from jmamba.mixers.mamba2 import Mamba2, Mamba2State, mamba2_tp_rules
from jmamba.parallel.collectives import WHOLE, TensorParallel
from jmamba.parallel.rules import ShardRule
from jmamba.step.pytree import StepInputs

# A leaf of the cache: an array, or in `tp_axes` the axis of that array that tensor parallelism
# splits (the same pytree).
_Leaf = TypeVar("_Leaf", default=jax.Array)


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class ParallelHybridCache(Generic[_Leaf]):
    """The two states of one parallel hybrid layer.

    Attributes:
      kv: the attention half's paged KV cache (`KVCache`, by block; block 0 is NULL).
      state: the Mamba2 half's conv and SSM state (`Mamba2State`, by slot; slot 0 is NULL).
    """

    kv: KVCache[_Leaf]
    state: Mamba2State[_Leaf]

    @staticmethod
    def zeros(
        attention: AttentionConfig,
        mamba2: Mamba2Config,
        *,
        num_blocks: int,
        block_size: int,
        num_slots: int,
        dtype: jnp.dtype,
        kv_dtype: jnp.dtype,
        state_dtype: jnp.dtype = jnp.float32,
    ) -> ParallelHybridCache:
        """Zeroed caches: the KV pool in `kv_dtype`, the conv state in `dtype`, the SSM state in
        `state_dtype`."""
        return ParallelHybridCache(
            KVCache.zeros(attention, num_blocks, block_size, kv_dtype),
            Mamba2State.zeros(mamba2, num_slots, dtype, state_dtype),
        )

    @staticmethod
    def tp_axes() -> ParallelHybridCache[int]:
        """The axis of each array that tensor parallelism splits (each half's own)."""
        return ParallelHybridCache(KVCache.tp_axes(), Mamba2State.tp_axes())


def parallel_hybrid_tp_rules(
    attention: AttentionConfig, mamba2: Mamba2Config
) -> dict[tuple[str, ...], ShardRule]:
    """Each half's rules under its name."""
    halves = {"attention": attention_tp_rules(attention), "mamba2": mamba2_tp_rules(mamba2)}
    return {(half, *path): rule for half, rules in halves.items() for path, rule in rules.items()}


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
        tp: TensorParallel = WHOLE,
    ):
        self.attention = Attention(hidden, attention, norm_eps, norm_offset, rngs=rngs)
        self.mamba2 = Mamba2(hidden, mamba2, norm_eps, rngs=rngs, tp=tp)

    def __call__(
        self, x: jax.Array, cache: ParallelHybridCache, inputs: StepInputs
    ) -> tuple[jax.Array, ParallelHybridCache]:
        # Scopes inside the layer's own, so a profile splits the layer's time between its halves.
        with jax.named_scope("attention"):
            y_attention, kv = self.attention(x, cache.kv, inputs)
        with jax.named_scope("mamba2"):
            y_mamba2, state = self.mamba2(x, cache.state, inputs)
        return y_attention + y_mamba2, ParallelHybridCache(kv, state)
