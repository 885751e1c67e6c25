"""The Gated DeltaNet mixer (Qwen3-Next / Qwen3.5 linear attention) and its per-slot state.

[q | k | v | z | b | a] = x W_in                (one projection; the loader packs HF's)
[q | k | v]             = silu(causal_conv1d([q | k | v]))
q, k                    = l2norm(q), l2norm(k);  q *= 1 / sqrt(d_k)
beta = sigmoid(b),  g = -exp(A_log) * softplus(a + dt_bias)          (log decay, per value head)
S_t  = S_{t-1} exp(g_t) + beta_t (v_t - S_{t-1} exp(g_t) k_t) k_t^T    (S: [d_v, d_k] per head)
o_t  = S_t q_t
out  = (rmsnorm(o) * w * silu(z)) W_out          (per head)

A_log, dt_bias, the conv taps and the norm weight stay fp32 in a bf16 model (`Fp32Param`). Unlike
Mamba2 the parameter stays A_log: the decode kernel takes A_log and forms the decay -exp(A_log) in
registers, and prefill's -exp(A_log) fuses into the gate computation, so no step has a separate
op for it.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Generic

import jax
import jax.numpy as jnp
from flax import nnx
from typing_extensions import TypeVar

from jmamba.layer_configs import GDN_CHUNK_SIZE, GDNConfig
from jmamba.layers.fp32_param import Fp32Param
from jmamba.layers.linear import Linear
from jmamba.layers.norms import HeadGatedRMSNorm
from jmamba.mixers.boundary_states import kernel_rows, write_conv_windows
from jmamba.mixers.token_layout import run_by_section
from jmamba.parallel.rules import REPLICATED, Segment, ShardRule, split
from jmamba.step.pytree import StepInputs
from pallas_kernels import ops

# A leaf of the cache: an array, or in `tp_axes` the axis of that array that tensor parallelism
# splits (the same pytree).
_Leaf = TypeVar("_Leaf", default=jax.Array)


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class GDNState(Generic[_Leaf]):
    """Recurrent state of one Gated DeltaNet layer for every state slot (slot 0 is NULL).

    Attributes:
      conv: [num_slots, conv_dim, d_conv - 1] last inputs of the causal conv, newest last.
      recurrent: [num_slots, num_v_heads, head_v_dim, head_k_dim] delta-rule state, V-first
        (fp32 by default, bf16 allowed: `jmamba.cache_dtypes`).
    """

    conv: _Leaf
    recurrent: _Leaf

    @staticmethod
    def zeros(
        cfg: GDNConfig, num_slots: int, dtype: jnp.dtype, state_dtype: jnp.dtype = jnp.float32
    ) -> GDNState:
        return GDNState(
            jnp.zeros((num_slots, cfg.conv_dim, cfg.d_conv - 1), dtype),
            jnp.zeros((num_slots, cfg.num_v_heads, cfg.head_v_dim, cfg.head_k_dim), state_dtype),
        )

    @staticmethod
    def tp_axes() -> GDNState[int]:
        """The axis of each array that tensor parallelism splits: conv channels, value heads."""
        return GDNState(1, 1)


def _heads(cfg: GDNConfig) -> tuple[Segment, Segment]:
    """Key heads (head_k_dim channels each) and value heads (head_v_dim each)."""
    return (
        Segment("gdn.num_k_heads", cfg.num_k_heads, cfg.head_k_dim, replicable=True),
        Segment("gdn.num_v_heads", cfg.num_v_heads, cfg.head_v_dim),
    )


def gdn_shard(cfg: GDNConfig, shards: int) -> GDNConfig:
    """The config of one of `shards` tensor-parallel shards: its value heads, and its key heads
    (the one its value heads read when there are fewer key heads than shards)."""
    k_heads, v_heads = _heads(cfg)
    return dataclasses.replace(
        cfg, num_k_heads=k_heads.local_units(shards), num_v_heads=v_heads.local_units(shards)
    )


def gdn_tp_rules(cfg: GDNConfig) -> dict[tuple[str, ...], ShardRule]:
    """Value heads over tp with their v and z channels, gates, conv channels and out_proj rows
    (row-parallel); key heads (q and k channels) over tp or replicated; the per-head norm whole."""
    k_heads, v_heads = _heads(cfg)
    per_head = dataclasses.replace(v_heads, unit_size=1)
    return {
        ("in_proj", "kernel"): split(1, k_heads, k_heads, v_heads, v_heads, per_head, per_head),
        ("conv_weight",): split(0, k_heads, k_heads, v_heads),  # [q | k | v]
        ("dt_bias",): split(0, per_head),
        ("A_log",): split(0, per_head),
        ("norm", "weight"): REPLICATED,
        ("out_proj", "kernel"): split(0, v_heads),
    }


class GatedDeltaNet(nnx.Module):
    """The Gated DeltaNet token mixer: `(x, state, inputs) -> (y, new_state)`."""

    def __init__(self, hidden: int, cfg: GDNConfig, norm_eps: float, *, rngs: nnx.Rngs):
        self.cfg = cfg
        self.in_proj = Linear(hidden, cfg.conv_dim + cfg.value_dim + 2 * cfg.num_v_heads, rngs=rngs)
        self.conv_weight = Fp32Param(
            jax.random.normal(rngs.params(), (cfg.conv_dim, cfg.d_conv), jnp.float32)
            / cfg.d_conv**0.5
        )
        self.dt_bias = Fp32Param(jnp.ones((cfg.num_v_heads,), jnp.float32))
        self.A_log = Fp32Param(jnp.log(jnp.linspace(1.0, 16.0, cfg.num_v_heads)))
        self.norm = HeadGatedRMSNorm(cfg.head_v_dim, norm_eps)
        self.out_proj = Linear(cfg.value_dim, hidden, rngs=rngs)

    def _split_qkv(self, qkv: jax.Array):
        cfg = self.cfg
        q, k, v = jnp.split(qkv, [cfg.key_dim, 2 * cfg.key_dim], axis=-1)
        lead = qkv.shape[:-1]
        return (
            q.reshape(*lead, cfg.num_k_heads, cfg.head_k_dim),
            k.reshape(*lead, cfg.num_k_heads, cfg.head_k_dim),
            v.reshape(*lead, cfg.num_v_heads, cfg.head_v_dim),
        )

    def _decode(self, inputs: StepInputs, mixed, state: GDNState):
        """One fused op over in_proj's output [R_d, W, d_in_proj]: conv, split, gates, update."""
        rows = inputs.decode
        o, conv, rec = ops.gdn_decode(
            mixed,
            self.conv_weight[...],
            None,
            state.conv,
            state.recurrent,
            self.A_log[...],
            self.dt_bias[...],
            rows.read_slots,
            rows.write_slots,
            use_qk_l2norm=True,
        )
        return o, GDNState(conv, rec)

    def _prefill(self, inputs: StepInputs, qkv, b, a, state: GDNState):
        rows = kernel_rows(inputs.prefill)
        qkv, conv = ops.causal_conv1d_prefill(
            qkv,
            self.conv_weight[...],
            None,
            write_conv_windows(qkv, state.conv, rows),
            rows,
            activation="silu",
        )
        q, k, v = self._split_qkv(qkv)
        a32 = a.astype(jnp.float32) + self.dt_bias[...]
        g = -jnp.exp(self.A_log[...]) * jax.nn.softplus(a32)
        beta = jax.nn.sigmoid(b.astype(jnp.float32))
        o, rec = ops.gdn_chunk(
            q,
            k,
            v,
            g,
            beta,
            state.recurrent,
            rows,
            use_qk_l2norm=True,
            chunk_size=GDN_CHUNK_SIZE,
        )
        return o, GDNState(conv, rec)

    def __call__(
        self, hidden: jax.Array, state: GDNState, inputs: StepInputs
    ) -> tuple[jax.Array, GDNState]:
        cfg = self.cfg
        mixed = self.in_proj(hidden)
        qkv, z, b, a = jnp.split(
            mixed,
            [
                cfg.conv_dim,
                cfg.conv_dim + cfg.value_dim,
                cfg.conv_dim + cfg.value_dim + cfg.num_v_heads,
            ],
            axis=-1,
        )
        # Decode reads in_proj's output by column offset, prefill its split columns.
        o, state = run_by_section(
            inputs,
            state,
            (mixed,),
            (qkv, b, a),
            functools.partial(self._decode, inputs),
            functools.partial(self._prefill, inputs),
            (cfg.num_v_heads, cfg.head_v_dim),
            hidden.dtype,
        )
        z = z.reshape(hidden.shape[0], cfg.num_v_heads, cfg.head_v_dim)
        y = self.norm(o, z).reshape(hidden.shape[0], cfg.value_dim)
        return self.out_proj(y), state
