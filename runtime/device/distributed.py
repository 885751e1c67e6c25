"""The data-parallel mesh and the processes that drive it.

One SPMD program runs over a 1-D mesh with axis `dp`: rank r is the r-th device of the mesh, holds
its own shard of every cache pool (its own NULL block and slot 0) and a replica of the parameters.
In a multi-host run (`jax.distributed.initialize` called before the engine is built) every process
drives the ranks whose devices it can address: it builds their inputs, reads their tokens, and
agrees with the other processes on each step's shape through `agree_max`, one small collective.

    process 0: ranks 0 .. L-1        process 1: ranks L .. 2L-1        (L local devices each)

A single process with one device is the degenerate case of the same code: a mesh of one rank.
"""

from __future__ import annotations

import dataclasses

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

AXIS = "dp"


@dataclasses.dataclass(frozen=True)
class DataParallelMesh:
    """The `dp` mesh and which of its ranks this process drives.

    Attributes:
      mesh: 1-D device mesh over axis `dp`, devices in process order.
      local_ranks: global rank ids this process drives, ascending and contiguous.
    """

    mesh: Mesh

    @property
    def size(self) -> int:
        return self.mesh.shape[AXIS]

    @property
    def local_ranks(self) -> tuple[int, ...]:
        mine = jax.process_index()
        return tuple(r for r, d in enumerate(self.mesh.devices) if d.process_index == mine)

    @property
    def replicated(self) -> NamedSharding:
        return NamedSharding(self.mesh, P())

    @property
    def by_rank(self) -> NamedSharding:
        """Leading axis split over ranks (caches on their pool axis, stacked per-rank inputs)."""
        return NamedSharding(self.mesh, P(AXIS))

    def global_array(self, local: np.ndarray) -> jax.Array:
        """[len(local_ranks), ...] rows of this process's ranks -> the global [size, ...] array."""
        shape = (self.size, *local.shape[1:])
        return jax.make_array_from_process_local_data(self.by_rank, local, shape)

    def local_rows(self, array: jax.Array) -> np.ndarray:
        """The rows of a [size, ...] rank-sharded array that belong to this process's ranks."""
        shards = sorted(array.addressable_shards, key=lambda s: s.index[0].start or 0)
        return np.concatenate([np.asarray(s.data) for s in shards])

    def start_copy_to_host(self, array: jax.Array) -> None:
        """Enqueue the device-to-host copy of this process's rows of `array` now, so that a later
        `local_rows` waits for this step alone, not for steps dispatched after it."""
        for shard in array.addressable_shards:
            shard.data.copy_to_host_async()


def initialize(coordinator_address: str, num_processes: int, process_id: int) -> None:
    """Join a multi-host run: call once per process, before any JAX computation or engine.

    Each process then drives the ranks of its own devices (`DataParallelMesh.local_ranks`) and
    serves the requests added to it: requests reach a process through whatever the launcher does
    (each process of `jmamba generate` reads its own prompts; a Python driver might split one list
    by process index), and the process's router places them on its local ranks only. On CPU
    devices the cross-process collectives go through gloo.
    """
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.distributed.initialize(coordinator_address, num_processes, process_id)


def make_mesh(size: int) -> DataParallelMesh:
    """A `dp` mesh of `size` devices (all devices of every process, in process order)."""
    devices = jax.devices()
    if not 1 <= size <= len(devices):
        raise ValueError(
            f"data_parallel_size={size} must be in [1, {len(devices)}] (the devices JAX sees: "
            f"{len(devices)} {devices[0].platform})"
        )
    if size > 1 and size < len(devices) and jax.process_count() > 1:
        raise ValueError(
            f"data_parallel_size={size}: a multi-host run uses every device ({len(devices)})"
        )
    ordered = sorted(devices, key=lambda d: (d.process_index, d.id))[:size]
    return DataParallelMesh(Mesh(np.array(ordered), (AXIS,)))


def agree_max(local: np.ndarray) -> np.ndarray:
    """Elementwise max of a small int vector over all processes (identity with one process).

    Every process must call it at the same point of every step: it is a collective.
    """
    if jax.process_count() == 1:
        return local
    from jax.experimental import multihost_utils

    return np.asarray(multihost_utils.process_allgather(local)).max(axis=0)
