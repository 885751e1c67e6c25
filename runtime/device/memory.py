"""What one device's memory holds: its parameter shard and one entry of each pool, in bytes
(`runtime.core.pool_memory.PoolMemory`, which sizes the KV pool from them with
`EngineConfig.gpu_memory_utilization`)."""

from __future__ import annotations

import jax
import numpy as np
from flax import nnx

from jmamba.model import HybridLM
from runtime.core.config import EngineConfig
from runtime.core.pool_memory import PoolMemory
from runtime.device.placement import shard_model_shapes


def device_memory() -> int | None:
    """The first local device's memory limit in bytes; None where the device reports none (the
    CPU)."""
    stats = jax.local_devices()[0].memory_stats()
    return None if not stats or "bytes_limit" not in stats else int(stats["bytes_limit"])


def pool_memory(model: HybridLM, config: EngineConfig) -> PoolMemory | None:
    """One device's bytes for `model` split over `config.tensor_parallel_size` shards, when
    `config` sizes its KV blocks from memory and the device reports its memory; else None."""
    if not config.sizes_blocks_from_memory:
        return None
    limit = device_memory()
    if limit is None:
        return None
    shard = shard_model_shapes(model, config.tensor_parallel_size, model.dtype)
    params = sum(_nbytes(leaf) for leaf in jax.tree.leaves(nnx.state(shard)))

    def cache_bytes(num_blocks: int, num_slots: int) -> int:
        caches = jax.eval_shape(
            lambda: shard.init_caches(
                num_blocks=num_blocks, block_size=config.block_size, num_slots=num_slots
            )
        )
        return sum(_nbytes(leaf) for leaf in jax.tree.leaves(caches))

    base = cache_bytes(2, 2)
    return PoolMemory(
        device_bytes=limit,
        param_bytes=params,
        block_bytes=cache_bytes(3, 2) - base,
        slot_bytes=cache_bytes(2, 3) - base,
    )


def _nbytes(leaf: jax.ShapeDtypeStruct) -> int:
    return int(np.prod(leaf.shape)) * np.dtype(leaf.dtype).itemsize
