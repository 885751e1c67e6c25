"""The model's parameters and caches placed on the `(dp, tp)` mesh, each device holding its shard.

Parameters: every parameter of the shard model (`jmamba.sharding.shard_config`) is one global
array `[T, *local shape]` split over `tp` on its first axis and replicated over `dp`: device
(r, t) holds shard t's value, sliced on the host from the whole value by the parameter's rule
(`jmamba.sharding.param_rules`) and copied to that device alone, so the whole model never sits
on one device. A parameter every shard holds whole (a norm weight) is one copy per device, as
without tensor parallelism. One shard (T = 1) is the same code: `[1, *shape]` on every device.

How the values reach the devices is the runner's `ParamSource`: `place_params` slices a whole
model's values (a loaded checkpoint); `CheckpointShards` reads each shard's slices from a
checkpoint's files; `RandomShards` makes random values on each shard, for bench models too large
for one device (in both the whole model is shapes only).

Caches: each pool array is split over `dp` on its pool axis (rank r owns entries
`[r n, (r + 1) n)`) and over `tp` on its head or channel axis (`HybridLM.cache_tp_axes`).
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from jmamba.cache_dtypes import DEFAULT_CACHE_DTYPES, CacheDtypes
from jmamba.checkpoints.reader import TensorReader
from jmamba.checkpoints.shards import ShardValues, read_shards
from jmamba.checkpoints.source import param_path
from jmamba.checkpoints.weights import cast
from jmamba.model import HybridLM
from jmamba.sharding import shard_config, shard_values
from runtime.device.distributed import DeviceMesh
from runtime.device.footprint import log_pools


class PlacedParams(NamedTuple):
    """A shard model's parameters on the mesh.

    Attributes:
      graphdef: the shard model's structure (`nnx.split` of `HybridLM(shard config)`).
      treedef: the structure of its parameter state, for `jax.tree.unflatten(treedef, leaves)`.
      leaves: the global arrays, each [T, *local shape], split over tp (`DeviceMesh.by_shard`).
      shard_model: the shard model as shapes only (its config, dtype and `init_caches`).
      num_params: parameters of the whole model.
    """

    graphdef: Any
    treedef: Any
    leaves: list[jax.Array]
    shard_model: HybridLM
    num_params: int


ParamSource = Callable[[HybridLM, DeviceMesh], PlacedParams]  # how parameters reach the mesh


def shard_model_shapes(model: HybridLM, shards: int, dtype: Any) -> HybridLM:
    """One shard of `model` in `dtype`, as shapes only."""
    local = shard_config(model.config, shards)
    return nnx.eval_shape(lambda: cast(HybridLM(local, rngs=nnx.Rngs(0)), dtype))


def _num_params(model: HybridLM) -> int:
    return sum(int(np.prod(np.shape(leaf))) for leaf in jax.tree.leaves(nnx.state(model)))


def place_params(model: HybridLM, mesh: DeviceMesh) -> PlacedParams:
    """Slice every parameter of the whole `model` (on the host or a device) for the mesh's tp
    shards and place each slice on its devices."""
    whole = {param_path(path): v.get_value() for path, v in nnx.to_flat_state(nnx.state(model))}
    return _placed(model, mesh, shard_values(model.config, mesh.tp_size, whole))


@dataclasses.dataclass(frozen=True)
class CheckpointShards:
    """A `ParamSource` that reads the checkpoint in `model_dir` shard by shard: each tp shard's
    slice of each parameter is read from the safetensors files as slices
    (`jmamba.checkpoints.shards.read_shards`; some parameters are read whole and sliced, it says
    which) and placed on that shard's devices, one parameter at a time, so neither host nor
    device ever holds the whole model. The model the runner gets may be shapes only; its
    dtype is the parameters'. `reader` opens the files (tests count what it reads)."""

    model_dir: str | Path
    reader: Callable[[Path], TensorReader] = TensorReader

    def __call__(self, model: HybridLM, mesh: DeviceMesh) -> PlacedParams:
        values = read_shards(
            self.model_dir,
            mesh.tp_size,
            model.dtype,
            reader=self.reader,
            with_head=model.config.has_mtp,
        )
        return _placed(model, mesh, values)


def _placed(model: HybridLM, mesh: DeviceMesh, values: ShardValues) -> PlacedParams:
    """The shard model's parameters from (path, shard values) pairs, each placed on its
    devices as it comes."""
    shards = mesh.tp_size
    shard_model = shard_model_shapes(model, shards, model.dtype)
    graphdef, abstract = nnx.split(shard_model_shapes(model, shards, model.dtype))  # filled below
    flat = nnx.to_flat_state(abstract)
    variables = dict(flat)
    for path, per_shard in values:
        expected = variables[path].get_value().shape
        if per_shard[0].shape != expected:
            raise ValueError(
                f"shard of {path} is {per_shard[0].shape}, the shard model's {expected}"
            )
        variables[path].set_value(_on_shards(per_shard, mesh))
    leaves, treedef = jax.tree.flatten(nnx.from_flat_state(flat))
    return PlacedParams(graphdef, treedef, leaves, shard_model, _num_params(model))


@dataclasses.dataclass(frozen=True)
class RandomShards:
    """A `ParamSource` of random weights in `dtype` for bench models: matrices (and stacks of
    them) N(0, `scale`^2), vectors (norm weights, biases, per-head constants) ones. Each leaf is
    drawn on its own shards by a jitted draw compiled once per distinct shape (the whole model's
    initialiser compiled as one program took 296 s at the 80B shape): no device ever holds more
    than its shard, and the whole model may be shapes only (`nnx.eval_shape`)."""

    seed: int = 0
    dtype: str = "bfloat16"
    scale: float = 0.02

    def __call__(self, model: HybridLM, mesh: DeviceMesh) -> PlacedParams:
        shard_model = shard_model_shapes(model, mesh.tp_size, self.dtype)
        graphdef, abstract = nnx.split(shard_model)
        shapes, treedef = jax.tree.flatten(abstract)
        keys = jax.random.split(jax.random.key(self.seed), len(shapes))
        leaves = [
            _random_leaf(mesh, (mesh.tp_size, *s.shape), self.dtype, self.scale)(key)
            for s, key in zip(shapes, keys, strict=True)
        ]
        return PlacedParams(graphdef, treedef, leaves, shard_model, _num_params(model))


@functools.cache
def _random_leaf(
    mesh: DeviceMesh, shape: tuple[int, ...], dtype: str, scale: float
) -> Callable[[jax.Array], jax.Array]:
    """key -> a [T, ...] leaf split over tp shards: ones for a vector per shard ([T, n]), else
    N(0, scale^2). One compile per distinct shape."""

    def draw(key: jax.Array) -> jax.Array:
        if len(shape) <= 2:
            return jnp.ones(shape, dtype)
        return (scale * jax.random.normal(key, shape, jnp.float32)).astype(dtype)

    return jax.jit(draw, out_shardings=mesh.by_shard)


def _on_shards(values: list[np.ndarray], mesh: DeviceMesh) -> jax.Array:
    """The global [T, ...] array whose slice t (on every device of tp column t) is values[t]."""
    shape = (len(values), *values[0].shape)
    # jax types the callback's index `Index | None` but never passes None (it asserts so).
    return jax.make_array_from_callback(
        shape,
        mesh.by_shard,
        lambda index: values[index[0].start or 0][None],  # type: ignore[index]
    )


def cache_shardings(shard_model: HybridLM, mesh: DeviceMesh) -> tuple:
    """Per cache array, its `NamedSharding`: pool axis over dp, head axis over tp."""
    axes = shard_model.cache_tp_axes()
    shapes = _local_caches(shard_model, num_blocks=2, block_size=1, num_slots=2)
    return jax.tree.map(
        lambda a, s: jax.sharding.NamedSharding(mesh.mesh, mesh.pool_spec(s.ndim, a)), axes, shapes
    )


def zero_caches(
    shard_model: HybridLM,
    mesh: DeviceMesh,
    *,
    num_blocks: int,
    block_size: int,
    num_slots: int,
    dtypes: CacheDtypes = DEFAULT_CACHE_DTYPES,
) -> Any:
    """Zeroed caches of `num_blocks` blocks and `num_slots` slots per rank in `dtypes`, made
    directly on the mesh (each device allocates its own shard); logs what one device holds
    (`log_pools`)."""
    local = _local_caches(
        shard_model,
        num_blocks=num_blocks,
        block_size=block_size,
        num_slots=num_slots,
        dtypes=dtypes,
    )
    axes = shard_model.cache_tp_axes()
    ranks, shards = mesh.size, mesh.tp_size

    def global_shape(axis: int, s: jax.ShapeDtypeStruct) -> jax.ShapeDtypeStruct:
        shape = [ranks * s.shape[0], *s.shape[1:]]
        shape[axis] *= shards
        return jax.ShapeDtypeStruct(tuple(shape), s.dtype)

    shapes = jax.tree.map(global_shape, axes, local)
    shardings = cache_shardings(shard_model, mesh)
    make = jax.jit(
        lambda: jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), shapes),
        out_shardings=shardings,
    )
    caches = make()
    log_pools(
        shard_model,
        block_size=block_size,
        num_blocks=num_blocks,
        num_slots=num_slots,
        dtypes=dtypes,
    )
    return caches


def _local_caches(
    shard_model: HybridLM,
    *,
    num_blocks: int,
    block_size: int,
    num_slots: int,
    dtypes: CacheDtypes = DEFAULT_CACHE_DTYPES,
) -> Any:
    """One rank's one shard's caches, as shapes."""
    return jax.eval_shape(
        lambda: shard_model.init_caches(
            num_blocks=num_blocks, block_size=block_size, num_slots=num_slots, dtypes=dtypes
        )
    )
