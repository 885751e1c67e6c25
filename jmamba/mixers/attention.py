"""Softmax attention over a paged KV cache (NemotronH plain, Qwen3-Next gated with qk-norm + RoPE).

q, k, v = x Wq, x Wk, x Wv                  (Qwen3-Next: Wq also yields a per-head output gate)
q, k    = rmsnorm(q), rmsnorm(k)            (per head, when qk_norm)
q, k    = rope(q, pos), rope(k, pos)        (first rotary_dim dims, when rotary_dim > 0)
o       = softmax(q k^T / sqrt(d) + causal) v, over this row's cached keys
y       = (o * sigmoid(gate)) Wo            (gate only when output_gate)
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
from flax import nnx

from jmamba.config import AttentionConfig
from jmamba.inputs import StepInputs
from jmamba.layers.linear import Linear
from jmamba.layers.norms import RMSNorm
from jmamba.layers.rope import apply_rope
from jmamba.mixers.token_layout import decode_lane_valid, prefill_token_rows
from pallas_kernels import ops


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class KVCache:
    """Paged KV cache of one attention layer.

    Attributes:
      k: [num_blocks, block_size, num_kv_heads, head_dim]; block 0 is the NULL block.
      v: same shape as k.
    """

    k: jax.Array
    v: jax.Array

    @classmethod
    def zeros(
        cls, cfg: AttentionConfig, num_blocks: int, block_size: int, dtype: jnp.dtype
    ) -> KVCache:
        shape = (num_blocks, block_size, cfg.num_kv_heads, cfg.head_dim)
        return cls(jnp.zeros(shape, dtype), jnp.zeros(shape, dtype))


class Attention(nnx.Module):
    """Multi-head (grouped-query) attention reading and writing a paged KV cache."""

    def __init__(
        self,
        hidden: int,
        cfg: AttentionConfig,
        norm_eps: float,
        norm_offset: float,
        *,
        rngs: nnx.Rngs,
    ):
        self.cfg = cfg
        q_width = cfg.num_heads * cfg.head_dim * (2 if cfg.output_gate else 1)
        self.q_proj = Linear(hidden, q_width, rngs=rngs)
        self.k_proj = Linear(hidden, cfg.num_kv_heads * cfg.head_dim, rngs=rngs)
        self.v_proj = Linear(hidden, cfg.num_kv_heads * cfg.head_dim, rngs=rngs)
        self.o_proj = Linear(cfg.num_heads * cfg.head_dim, hidden, rngs=rngs)
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
        q, k, v, gate = self._project(x, inputs.positions)
        rows, valid = _token_rows(inputs)
        k_cache, v_cache = ops.write_kv(cache.k, cache.v, k, v, inputs.kv_slots, valid)
        block_table = jnp.concatenate([inputs.decode.block_table, inputs.prefill.block_table])
        o = ops.paged_attention(
            q,
            k_cache,
            v_cache,
            block_table,
            rows,
            inputs.positions,
            valid,
            scale=cfg.head_dim**-0.5,
        )
        o = o.reshape(x.shape[0], -1)
        if gate is not None:
            o = (o.astype(jnp.float32) * jax.nn.sigmoid(gate.astype(jnp.float32))).astype(x.dtype)
        return self.o_proj(o), KVCache(k_cache, v_cache)


def _token_rows(inputs: StepInputs) -> tuple[jax.Array, jax.Array]:
    """Row of every token in the stacked [decode rows; prefill rows] block table, and liveness."""
    dec = inputs.decode
    dec_rows = jnp.repeat(jnp.arange(dec.num_rows), dec.width)
    dec_valid = decode_lane_valid(inputs).reshape(-1)
    pre_rows, pre_valid = prefill_token_rows(inputs)
    rows = jnp.concatenate([dec_rows, pre_rows + dec.num_rows]).astype(jnp.int32)
    return rows, jnp.concatenate([dec_valid, pre_valid])
