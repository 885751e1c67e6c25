"""Softmax attention over a paged KV cache (NemotronH plain, Qwen3-Next gated with qk-norm + RoPE).

q, k, v = x Wq, x Wk, x Wv                  (Qwen3-Next: Wq also yields a per-head output gate)
q, k    = rmsnorm(q), rmsnorm(k)            (per head, when qk_norm)
q, k    = rope(q, pos), rope(k, pos)        (first rotary_dim dims, when rotary_dim > 0)
o       = softmax(q k^T * scale + causal) v, over this row's cached keys (scale 1/sqrt(d) or
          the checkpoint's own: Granite's attention_multiplier)
y       = (o * sigmoid(gate)) Wo            (gate only when output_gate)
"""

from __future__ import annotations

import dataclasses
from typing import Generic

import jax
import jax.numpy as jnp
from flax import nnx
from typing_extensions import TypeVar

from jmamba.fp8_plan import Fp8Plan, module_at
from jmamba.layer_configs import AttentionConfig
from jmamba.layers.linear import Linear
from jmamba.layers.norms import RMSNorm
from jmamba.layers.rope import apply_rope
from jmamba.mixers.token_layout import (
    decode_lane_valid,
    join_sections,
    prefill_token_rows,
    split_sections,
)
from jmamba.parallel.rules import REPLICATED, Segment, ShardRule, split
from jmamba.step.pytree import StepInputs
from pallas_kernels import ops

# A leaf of the cache: an array, or in `tp_axes` the axis of that array that tensor parallelism
# splits (the same pytree).
_Leaf = TypeVar("_Leaf", default=jax.Array)


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class KVCache(Generic[_Leaf]):
    """Paged KV cache of one attention layer, in the model's dtype or FP8 (e4m3,
    `jmamba.cache_dtypes`): `ops.write_kv` quantizes what it stores (divided by the layer's
    `Attention.kv_scales`) and the attention ops dequantize what they read (times them).

    Attributes:
      k: [num_blocks, block_size, num_kv_heads, head_dim]; block 0 is the NULL block.
      v: same shape as k.
    """

    k: _Leaf
    v: _Leaf

    @staticmethod
    def zeros(cfg: AttentionConfig, num_blocks: int, block_size: int, dtype: jnp.dtype) -> KVCache:
        shape = (num_blocks, block_size, cfg.num_kv_heads, cfg.head_dim)
        return KVCache(jnp.zeros(shape, dtype), jnp.zeros(shape, dtype))

    @staticmethod
    def tp_axes() -> KVCache[int]:
        """The axis of each array that tensor parallelism splits: the KV heads."""
        return KVCache(2, 2)


def _heads(cfg: AttentionConfig) -> tuple[Segment, Segment]:
    """Query heads (each with its output gate) and KV heads, as units of the projections."""
    q_width = cfg.head_dim * (2 if cfg.output_gate else 1)  # per head: [q | gate]
    return (
        Segment("attention.num_heads", cfg.num_heads, q_width),
        Segment("attention.num_kv_heads", cfg.num_kv_heads, cfg.head_dim, replicable=True),
    )


def attention_shard(cfg: AttentionConfig, shards: int) -> AttentionConfig:
    """The config of one of `shards` tensor-parallel shards: its query heads, and its KV heads
    (the one its query heads read when there are fewer KV heads than shards)."""
    heads, kv_heads = _heads(cfg)
    return dataclasses.replace(
        cfg, num_heads=heads.local_units(shards), num_kv_heads=kv_heads.local_units(shards)
    )


def attention_tp_rules(cfg: AttentionConfig) -> dict[tuple[str, ...], ShardRule]:
    """Query heads over tp (q_proj's columns, o_proj's rows: row-parallel), KV heads over tp or
    replicated (k_proj, v_proj), the per-head q/k norms whole."""
    heads, kv_heads = _heads(cfg)
    o_rows = dataclasses.replace(heads, unit_size=cfg.head_dim)
    rules: dict[tuple[str, ...], ShardRule] = {
        ("q_proj", "kernel"): split(1, heads),
        ("k_proj", "kernel"): split(1, kv_heads),
        ("v_proj", "kernel"): split(1, kv_heads),
        ("o_proj", "kernel"): split(0, o_rows),
    }
    if cfg.qk_norm:
        rules |= {("q_norm", "weight"): REPLICATED, ("k_norm", "weight"): REPLICATED}
    return rules


class Attention(nnx.Module):
    """Multi-head (grouped-query) attention reading and writing a paged KV cache: [T, hidden] in,
    [T, out_features] out (`hidden` where None; Zamba2's block maps 2 x hidden to hidden).

    `kv_scales` (k_scale, v_scale), static: what an FP8 cache stores keys and values divided by
    and reads them back times (vLLM's calibrated scales, `with_kv_scales`); 1.0 by default, and
    unused by a cache of a wider dtype."""

    def __init__(
        self,
        hidden: int,
        cfg: AttentionConfig,
        norm_eps: float,
        norm_offset: float,
        *,
        rngs: nnx.Rngs,
        out_features: int | None = None,
    ):
        self.cfg = cfg
        self.kv_scales = (1.0, 1.0)
        q_width = cfg.num_heads * cfg.head_dim * (2 if cfg.output_gate else 1)
        self.q_proj = Linear(hidden, q_width, rngs=rngs)
        self.k_proj = Linear(hidden, cfg.num_kv_heads * cfg.head_dim, rngs=rngs)
        self.v_proj = Linear(hidden, cfg.num_kv_heads * cfg.head_dim, rngs=rngs)
        self.o_proj = Linear(cfg.num_heads * cfg.head_dim, out_features or hidden, rngs=rngs)
        if cfg.qk_norm:
            self.q_norm = RMSNorm(cfg.head_dim, norm_eps, norm_offset)
            self.k_norm = RMSNorm(cfg.head_dim, norm_eps, norm_offset)

    def _project(self, x: jax.Array, positions: jax.Array):
        cfg = self.cfg
        t = x.shape[0]
        q = self.q_proj(x).reshape(t, cfg.num_heads, -1)
        gate = None
        if cfg.output_gate:  # per head: [q | gate]
            q, gate = q[..., : cfg.head_dim], q[..., cfg.head_dim :].reshape(t, -1)
        k = self.k_proj(x).reshape(t, cfg.num_kv_heads, cfg.head_dim)
        v = self.v_proj(x).reshape(t, cfg.num_kv_heads, cfg.head_dim)
        if cfg.qk_norm:
            q, k = self.q_norm(q), self.k_norm(k)
        q = apply_rope(q, positions, cfg.rotary_dim, cfg.rope_theta)
        k = apply_rope(k, positions, cfg.rotary_dim, cfg.rope_theta)
        return q, k, v, gate

    def __call__(
        self, x: jax.Array, cache: KVCache, inputs: StepInputs
    ) -> tuple[jax.Array, KVCache]:
        cfg = self.cfg
        positions, kv_slots = jnp.asarray(inputs.positions), jnp.asarray(inputs.kv_slots)
        q, k, v, gate = self._project(x, positions)
        scales = self._cache_scales(cache)
        k_cache, v_cache = ops.write_kv(cache.k, cache.v, k, v, kv_slots, _live(inputs), **scales)
        q_decode, q_prefill = split_sections(q, inputs)
        scale = cfg.scale
        o_decode = jnp.zeros_like(q_decode)
        if inputs.decode.num_rows:  # each row reads only its own blocks, up to its length
            rows = inputs.decode
            o_decode = ops.paged_decode_attention(
                q_decode,
                k_cache,
                v_cache,
                rows.block_table,
                rows.seq_lens,
                rows.query_lens,
                scale=scale,
                **scales,
            )
        o_prefill = jnp.zeros_like(q_prefill)
        if inputs.num_prefill_tokens:
            token_rows, live = prefill_token_rows(inputs)
            o_prefill = ops.paged_attention(
                q_prefill,
                k_cache,
                v_cache,
                jnp.asarray(inputs.prefill.block_table),
                token_rows.astype(jnp.int32),
                positions[inputs.num_decode_tokens :],
                live,
                scale=scale,
                **scales,
            )
        o = join_sections(o_decode, o_prefill).reshape(x.shape[0], -1)
        if gate is not None:
            o = (o.astype(jnp.float32) * jax.nn.sigmoid(gate.astype(jnp.float32))).astype(x.dtype)
        return self.o_proj(o), KVCache(k_cache, v_cache)

    def _cache_scales(self, cache: KVCache) -> dict[str, float]:
        """The ops' k_scale / v_scale: the layer's for a one-byte (FP8) cache, else 1.0."""
        k_scale, v_scale = self.kv_scales if jnp.dtype(cache.k.dtype).itemsize == 1 else (1, 1)
        return {"k_scale": float(k_scale), "v_scale": float(v_scale)}


def with_kv_scales(model: nnx.Module, plan: Fp8Plan) -> None:
    """Give each attention layer at one of the plan's `kv_scales` paths its (k_scale, v_scale)
    (a path under a part the model was built without is passed over, as `with_fp8_linears`)."""
    for path, k_scale, v_scale in plan.kv_scales:
        attention = module_at(model, path)
        if attention is not None:
            attention.kv_scales = (k_scale, v_scale)


def _live(inputs: StepInputs) -> jax.Array:
    """[T] bool: live decode lanes, then live prefill tokens."""
    _, prefill_live = prefill_token_rows(inputs)
    return jnp.concatenate([decode_lane_valid(inputs).reshape(-1), prefill_live])
