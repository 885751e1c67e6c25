"""`HybridLM`: embedding, a stack of layers whose kinds are data, final norm, LM head.

Each layer is an optional token mixer and an optional feed-forward block, each pre-normed with a
residual connection; every layer also gets the token embeddings, which only a mixer kind that
reads them uses (`Mixer.reads_embeddings`: Zamba2's transformer block over [x | embeddings]). The
model is a pure function of its inputs and caches:
`logits, caches = model(inputs, caches)`; the runtime splits it once (`nnx.split`) and jits
`step(params, caches, inputs)` with the caches donated.

The same code runs one tensor-parallel shard of a model: built from the config of one of T
shards (`jmamba.sharding.shard_config`), inside `jax.shard_map` over mesh axis `tp`, each layer
all-reduces its mixer's and FFN's partial outputs, the embedding and the LM head hold one slice
of the vocabulary, and every shard returns the whole vocabulary's logits (gathered). The
collectives go through `TensorParallel`, the identity in a whole model.
"""

from __future__ import annotations

import copy
import dataclasses

import jax
import jax.numpy as jnp
from flax import nnx

from jmamba.cache_dtypes import DEFAULT_CACHE_DTYPES, CacheDtypes
from jmamba.config import Mixer, ModelConfig
from jmamba.layer import Layer, LayerCache
from jmamba.layers.fp8_experts import with_fp8_experts
from jmamba.layers.fp8_linear import with_fp8_linears
from jmamba.layers.linear import Linear
from jmamba.layers.matmul import matmul
from jmamba.layers.norms import RMSNorm
from jmamba.mixers.attention import KVCache, with_kv_scales
from jmamba.mixers.gated_deltanet import GDNState
from jmamba.mixers.mamba2 import Mamba2State
from jmamba.mixers.parallel_hybrid import ParallelHybridCache
from jmamba.mtp import MTPHead
from jmamba.parallel.collectives import TensorParallel
from jmamba.step.pytree import StepInputs

__all__ = ["HybridLM", "LayerCache", "rows_or_zeros"]


def rows_or_zeros(table: jax.Array, index: jax.typing.ArrayLike) -> jax.Array:
    """`table[index]` along axis 0, with zeros for an index outside [0, len(table)).

    A plain device gather clamps an out-of-range index to the last row and wraps -1 to it
    (docs/architecture.md section 5), so a bad token id or logits index would silently read a live
    row.
    """
    size, index = table.shape[0], jnp.asarray(index)
    index = jnp.where((index >= 0) & (index < size), index, size)
    return table.at[index].get(mode="fill", fill_value=0)


class HybridLM(nnx.Module):
    """A hybrid causal language model over the token layout of `StepInputs` (or one
    tensor-parallel shard of one: `config.num_shards` > 1)."""

    def __init__(self, config: ModelConfig, *, rngs: nnx.Rngs):
        self.config = config
        self.tp = TensorParallel(config.num_shards)
        embed = jax.random.normal(rngs.params(), (config.vocab_per_shard, config.hidden_size))
        self.embed = nnx.Param(embed.astype(jnp.float32))
        self.layers = nnx.List(
            [
                Layer(config, m, f, rngs=rngs)
                for m, f in zip(config.mixers, config.ffns, strict=True)
            ]
        )
        self.final_norm = RMSNorm(config.hidden_size, config.norm_eps, config.norm_offset)
        self.lm_head = (
            None
            if config.tie_word_embeddings
            else Linear(config.hidden_size, config.vocab_per_shard, rngs=rngs)
        )
        self.mtp = MTPHead(config, rngs=rngs) if config.has_mtp else None
        with_fp8_linears(self, config.quantization)
        with_fp8_experts(self, config.quantization)
        with_kv_scales(self, config.quantization)

    def without_head(self) -> HybridLM:
        """This model without its MTP head (sharing every other parameter): what an engine that
        does not draft with the head serves, so the head costs it neither parameter memory nor
        KV pools. The model itself when it has no head."""
        if self.mtp is None:
            return self
        bare = copy.copy(self)
        bare.mtp = None
        bare.config = dataclasses.replace(self.config, mtp_mixers=(), mtp_ffns=())
        return bare

    @property
    def dtype(self) -> jnp.dtype:
        return jnp.dtype(self.embed.get_value().dtype)  # also of a model of shapes only

    def init_caches(
        self,
        *,
        num_blocks: int,
        block_size: int,
        num_slots: int,
        dtypes: CacheDtypes = DEFAULT_CACHE_DTYPES,
    ) -> tuple[LayerCache, ...]:
        """Zeroed per-layer caches, then the MTP head's (a KV cache per attention layer, indexed
        by the same block tables); block 0 and slot 0 are the reserved NULL entries. `dtypes`:
        the KV pools' and recurrent states' dtypes (`jmamba.cache_dtypes`); conv states are in
        the model's dtype."""
        if num_slots < 2 or num_blocks < 1 or block_size < 1:
            raise ValueError(
                f"need num_slots >= 2 (got {num_slots}), num_blocks >= 1 "
                f"(got {num_blocks}) and block_size >= 1 (got {block_size})"
            )
        cfg, dtype = self.config, self.dtype
        kv_dtype, state_dtype = dtypes.kv_dtype(dtype), dtypes.state_dtype

        def cache_for(kind: Mixer) -> LayerCache:
            match kind:
                case Mixer.ATTENTION:
                    return KVCache.zeros(cfg.need_attention(), num_blocks, block_size, kv_dtype)
                case Mixer.MAMBA2:
                    return Mamba2State.zeros(cfg.need_mamba2(), num_slots, dtype, state_dtype)
                case Mixer.GDN:
                    return GDNState.zeros(cfg.need_gdn(), num_slots, dtype, state_dtype)
                case Mixer.PARALLEL_HYBRID | Mixer.TRANSFORMER_MAMBA2:
                    return ParallelHybridCache.zeros(
                        cfg.need_attention(),
                        cfg.need_mamba2(),
                        num_blocks=num_blocks,
                        block_size=block_size,
                        num_slots=num_slots,
                        dtype=dtype,
                        kv_dtype=kv_dtype,
                        state_dtype=state_dtype,
                    )
                case Mixer.NONE:
                    return None

        return tuple(cache_for(kind) for kind in (*cfg.mixers, *cfg.mtp_mixers))

    def cache_tp_axes(self) -> tuple:
        """Per layer, the caches' pytree with, at each array, the axis tensor parallelism splits
        (its heads or channels), as `init_caches` lays them out."""
        axes = {
            Mixer.ATTENTION: KVCache.tp_axes,
            Mixer.MAMBA2: Mamba2State.tp_axes,
            Mixer.GDN: GDNState.tp_axes,
            Mixer.PARALLEL_HYBRID: ParallelHybridCache.tp_axes,
            Mixer.TRANSFORMER_MAMBA2: ParallelHybridCache.tp_axes,  # its cache is the same
        }
        kinds = (*self.config.mixers, *self.config.mtp_mixers)
        return tuple(axes[kind]() if kind in axes else None for kind in kinds)

    def __call__(
        self, inputs: StepInputs, caches: tuple[LayerCache, ...]
    ) -> tuple[jax.Array, tuple[LayerCache, ...]]:
        """Run one step; returns fp32 logits at `inputs.logits_indices` (the whole vocabulary,
        on every shard) and the new caches."""
        x, caches = self.hidden_states(inputs, caches)
        with jax.named_scope("lm_head"):
            return self.logits(rows_or_zeros(x, inputs.logits_indices)), caches

    def hidden_states(
        self, inputs: StepInputs, caches: tuple[LayerCache, ...]
    ) -> tuple[jax.Array, tuple[LayerCache, ...]]:
        """The last layer's output [T, hidden] (before the final norm) of every token lane, and
        the new caches (the MTP head's passed through unchanged)."""
        x = self.embed_tokens(inputs.token_ids)
        embeddings = x  # every layer gets them; only `Mixer.reads_embeddings` kinds read them
        num_layers = self.config.num_layers
        new_caches = []
        for layer, cache in zip(self.layers, caches[:num_layers], strict=True):
            x, cache = layer(x, cache, inputs, embeddings)
            new_caches.append(cache)
        return x, (*new_caches, *caches[num_layers:])

    def embed_tokens(self, token_ids: jax.typing.ArrayLike) -> jax.Array:
        """[T, hidden] embedding rows of `token_ids`, times `embedding_multiplier`."""
        return self._embed(jnp.asarray(token_ids)) * self.config.embedding_multiplier

    def logits(self, x: jax.Array) -> jax.Array:
        """fp32 logits of rows of the last layer's output (final-normed here)."""
        return self.head_logits(self.final_norm(x))

    def mtp_hidden(
        self,
        hidden: jax.Array,
        next_ids: jax.Array,
        inputs: StepInputs,
        caches: tuple[LayerCache, ...],
    ) -> tuple[jax.Array, tuple[LayerCache, ...]]:
        """The MTP head over a step's token lanes (`jmamba.mtp.MTPHead`): `hidden` [T, hidden]
        final-normed (the target's, or the head's own output when it drafts on), `next_ids` [T]
        the token after each lane's. Returns the head's normed output [T, hidden] (its logits:
        `head_logits`) and the caches with the head's written."""
        if self.mtp is None:
            raise ValueError(
                f"{self.config.architecture} has no MTP head (`ModelConfig.mtp_mixers`)"
            )
        num_layers = self.config.num_layers
        normed, mtp_caches = self.mtp(
            hidden, self.embed_tokens(next_ids), caches[num_layers:], inputs
        )
        return normed, (*caches[:num_layers], *mtp_caches)

    def _embed(self, token_ids: jax.Array) -> jax.Array:
        """[T, hidden] embedding rows; a shard holds the rows of one vocabulary slice and
        contributes zeros for the other ids (so the all-reduce is the lookup)."""
        first = self.tp.index() * self.config.vocab_per_shard
        return self.tp.all_reduce(rows_or_zeros(self.embed[...], token_ids - first))

    def head_logits(self, x: jax.Array) -> jax.Array:
        """fp32 logits of normed rows, times `logits_multiplier`: the head GEMM emits
        fp32 (it accumulates in fp32 anyway), the sampler's dtype. A shard computes the logits of
        its vocabulary slice; the slices are gathered, so the sampler sees the whole vocabulary
        (the padding of the last slice cut off)."""
        head = self.embed[...].T if self.lm_head is None else self.lm_head.kernel[...]
        logits = matmul(x, head, jnp.float32)
        logits = self.tp.all_gather(logits, axis=-1)[:, : self.config.vocab_size]
        return logits * self.config.logits_multiplier
