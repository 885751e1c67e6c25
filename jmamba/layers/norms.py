"""RMSNorm and the two gated RMSNorms of the recurrent mixers (all computed in fp32, their weights
held in fp32: `Fp32Param`). Their sums of squares run `ops.row_sum_squares` under
`jmamba.layers.invariance.batch_invariant()`, so a row's statistics do not depend on the batch."""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from jmamba.layers.fp32_param import Fp32Param
from jmamba.layers.invariance import is_batch_invariant
from jmamba.parallel.collectives import WHOLE, TensorParallel
from pallas_kernels import ops


def sum_of_squares(x: jax.Array) -> jax.Array:
    """[..., D] -> [..., 1] fp32: sum of x^2 over the last axis (in a fixed order per row under
    `batch_invariant()`, else XLA's reduction)."""
    if is_batch_invariant():
        rows = x.reshape(-1, x.shape[-1])
        return ops.row_sum_squares(rows).reshape(*x.shape[:-1], 1)
    x = x.astype(jnp.float32)
    return jnp.sum(x * x, axis=-1, keepdims=True)


def rms_normalize(x: jax.Array, eps: float) -> jax.Array:
    """x / sqrt(mean(x^2) + eps) over the last axis, in fp32."""
    mean_sq = sum_of_squares(x) / x.shape[-1]
    return x.astype(jnp.float32) * jax.lax.rsqrt(mean_sq + eps)


class RMSNorm(nnx.Module):
    """`x_hat * (offset + w)`: offset 0 for plain norms, 1 for zero-centred ones (Qwen3-Next)."""

    def __init__(self, dim: int, eps: float, offset: float = 0.0):
        self.weight = Fp32Param(jnp.full((dim,), 1.0 - offset, jnp.float32))
        self.eps = eps
        self.offset = offset

    def __call__(self, x: jax.Array) -> jax.Array:
        w = self.weight[...] + self.offset
        return (rms_normalize(x, self.eps) * w).astype(x.dtype)


class GroupGatedRMSNorm(nnx.Module):
    """Mamba2's gated norm: `rmsnorm_per_group(y * silu(z)) * w` (gate before the norm), or with
    `norm_first` `rmsnorm_per_group(y) * w * silu(z)` (Falcon-H1's `mamba_norm_before_gate`).

    In a tensor-parallel shard whose norm group spans `span` shards (fewer groups than shards),
    the shard holds `group_size` of the group's `span * group_size` channels: the sums of squares
    of the `span` shards are added (`TensorParallel.sum_over_span`), so the statistics are those
    of the whole model.
    """

    def __init__(
        self,
        dim: int,
        group_size: int,
        eps: float,
        norm_first: bool = False,
        *,
        tp: TensorParallel = WHOLE,
        span: int = 1,
    ):
        self.weight = Fp32Param(jnp.ones((dim,), jnp.float32))
        self.group_size = group_size
        self.eps = eps
        self.norm_first = norm_first
        self.tp = tp
        self.span = span

    def _normalize(self, x: jax.Array) -> jax.Array:
        groups = x.astype(jnp.float32).reshape(*x.shape[:-1], -1, self.group_size)
        sum_sq = self.tp.sum_over_span(sum_of_squares(groups), self.span)
        mean_sq = sum_sq / (self.group_size * self.span)
        normed = groups * jax.lax.rsqrt(mean_sq + self.eps)
        return normed.reshape(x.shape) * self.weight[...]

    def __call__(self, y: jax.Array, z: jax.Array) -> jax.Array:
        gate = jax.nn.silu(z.astype(jnp.float32))
        if self.norm_first:
            return (self._normalize(y) * gate).astype(y.dtype)
        return self._normalize(y.astype(jnp.float32) * gate).astype(y.dtype)


class SiluGate(nnx.Module):
    """`y * silu(z)` in fp32: the gate of a Mamba2 mixer without a norm (no weight)."""

    def __call__(self, y: jax.Array, z: jax.Array) -> jax.Array:
        return (y.astype(jnp.float32) * jax.nn.silu(z.astype(jnp.float32))).astype(y.dtype)


class HeadGatedRMSNorm(nnx.Module):
    """Gated DeltaNet's gated norm per head: `rmsnorm(o) * w * silu(z)` (norm before the gate)."""

    def __init__(self, head_dim: int, eps: float):
        self.weight = Fp32Param(jnp.ones((head_dim,), jnp.float32))
        self.eps = eps

    def __call__(self, o: jax.Array, z: jax.Array) -> jax.Array:
        normed = rms_normalize(o, self.eps) * self.weight[...]
        return (normed * jax.nn.silu(z.astype(jnp.float32))).astype(o.dtype)
