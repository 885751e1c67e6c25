"""What one device holds of a model and its pools, in bytes, and the one start-up log line that
says it (`log_pools`, from `runtime.device.placement.zero_caches`)."""

from __future__ import annotations

import logging

import jax
import numpy as np
from flax import nnx

from jmamba.cache_dtypes import DEFAULT_CACHE_DTYPES, CacheDtypes
from jmamba.model import HybridLM

log = logging.getLogger(__name__)
MIB = 1 << 20


def device_memory() -> int | None:
    """The first local device's memory limit in bytes; None where the device reports none (the
    CPU)."""
    stats = jax.local_devices()[0].memory_stats()
    return None if not stats or "bytes_limit" not in stats else int(stats["bytes_limit"])


def nbytes(tree: object) -> int:
    """Bytes of every array or `ShapeDtypeStruct` leaf of `tree`."""
    leaves = jax.tree.leaves(tree)
    return sum(int(np.prod(leaf.shape)) * np.dtype(leaf.dtype).itemsize for leaf in leaves)


def param_bytes(shard_model: HybridLM) -> int:
    """Bytes of one device's parameter shard (`shard_model` may be shapes only)."""
    return nbytes(nnx.state(shard_model))


def cache_bytes(
    shard_model: HybridLM,
    block_size: int,
    num_blocks: int,
    num_slots: int,
    dtypes: CacheDtypes = DEFAULT_CACHE_DTYPES,
) -> int:
    """Bytes of one device's share of the caches of `num_blocks` KV blocks and `num_slots` state
    slots in `dtypes` (shapes only: nothing is allocated)."""
    shapes = jax.eval_shape(
        lambda: shard_model.init_caches(
            num_blocks=num_blocks, block_size=block_size, num_slots=num_slots, dtypes=dtypes
        )
    )
    return nbytes(shapes)


def entry_bytes(
    shard_model: HybridLM, block_size: int, dtypes: CacheDtypes = DEFAULT_CACHE_DTYPES
) -> tuple[int, int]:
    """(bytes of one KV block of every attention layer, bytes of one state slot of every
    recurrent layer) on one device, in `dtypes`: 0 for a pool the model does not have."""
    base = cache_bytes(shard_model, block_size, 2, 2, dtypes)
    block = cache_bytes(shard_model, block_size, 3, 2, dtypes) - base
    slot = cache_bytes(shard_model, block_size, 2, 3, dtypes) - base
    return block, slot


def log_pools(
    shard_model: HybridLM,
    *,
    block_size: int,
    num_blocks: int,
    num_slots: int,
    dtypes: CacheDtypes = DEFAULT_CACHE_DTYPES,
) -> str:
    """Log (INFO, this module's logger) and return the line that says one device's pools: the
    blocks and slots, their dtypes, the bytes of each, their total, beside the parameter shard
    and the device's memory."""
    block, slot = entry_bytes(shard_model, block_size, dtypes)
    pools = num_blocks * block + num_slots * slot
    limit = device_memory()
    memory = "not reported" if limit is None else f"{limit / MIB:.0f} MiB"
    cfg = shard_model.config
    line = (
        f"pools of {cfg.architecture} (tensor-parallel shard 1 of {cfg.num_shards}), per device: "
        f"{num_blocks} KV blocks x {block / MIB:.4f} MiB + {num_slots} state slots x "
        f"{slot / MIB:.4f} MiB = {pools / MIB:.1f} MiB ({dtypes.describe()}), beside "
        f"{param_bytes(shard_model) / MIB:.1f} MiB of parameters (device memory: {memory})"
    )
    log.info(line)
    return line
