"""`TensorParallel`: the collectives a model shard calls, one seam present in every model.

A model built from the config of one of T shards (`jmamba.sharding.shard_config`) runs inside
`jax.shard_map` over a mesh axis `tp` of T devices, on its own slice of every parameter and state.
Its layers reach the other shards only through this object: one all-reduce of each mixer's and
each FFN's partial output (row-parallel projections), an all-gather of the vocabulary-parallel
logits, and the sums of squares of a Mamba2 gated norm group that spans shards. A whole model is
one shard (T = 1): every method is then the identity and emits no collective, so the model runs
alone, outside any `shard_map`.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

TP_AXIS = "tp"  # the mesh axis the shards of one model lie on


@dataclasses.dataclass(frozen=True)
class TensorParallel:
    """The shards of one model: `size` of them on mesh axis `TP_AXIS` (1: a whole model)."""

    size: int = 1

    def index(self) -> jax.Array | int:
        """This shard's position on the `tp` axis (0 for a whole model)."""
        return 0 if self.size == 1 else jax.lax.axis_index(TP_AXIS)

    def all_reduce(self, x: jax.Array) -> jax.Array:
        """The sum of every shard's `x` (each shard's partial output of a row-parallel map)."""
        return x if self.size == 1 else jax.lax.psum(x, TP_AXIS)

    def all_gather(self, x: jax.Array, axis: int) -> jax.Array:
        """Every shard's `x` concatenated along `axis`, in shard order."""
        if self.size == 1:
            return x
        return jax.lax.all_gather(x, TP_AXIS, axis=axis % x.ndim, tiled=True)

    def sum_over_span(self, x: jax.Array, span: int) -> jax.Array:
        """The sum of `x` over the `span` consecutive shards this one is grouped with (shards
        s * span .. s * span + span - 1); `x` itself at span 1. Every shard of a group adds the
        same partials in the same order, so they agree bit for bit."""
        if span == 1:
            return x
        gathered = jax.lax.all_gather(x, TP_AXIS)  # [size, ...]
        by_group = jnp.sum(gathered.reshape(self.size // span, span, *x.shape), axis=1)
        return by_group[jax.lax.axis_index(TP_AXIS) // span]


WHOLE = TensorParallel()  # a whole model: one shard, no collectives
