"""The device mesh `(dp, tp)` and the processes that drive it.

One SPMD program runs over a 2-D mesh of D x T devices. Axis `dp` holds the data-parallel ranks:
rank r (row r of the mesh) has its own scheduler and its own shard of every cache pool (its own
NULL block and slot 0). Axis `tp` holds the T tensor-parallel shards of one model: the devices of
a rank run the same step inputs (replicated over `tp`) on their own slices of the parameters and
of the caches' heads (`jmamba.sharding`). In a multi-host run (`jax.distributed.initialize`
called before the engine is built) every process drives the ranks whose devices it can address
(all shards of a rank on one process): it builds their inputs, reads their tokens, and agrees
with the other processes on each step's shape through `agree_max`, one small collective.

    process 0: ranks 0 .. L-1        process 1: ranks L .. 2L-1        (L local devices each)

A single process with one device is the degenerate case of the same code: a 1 x 1 mesh.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from jmamba.parallel.collectives import TP_AXIS

AXIS = "dp"


@dataclasses.dataclass(frozen=True)
class DeviceMesh:
    """The `(dp, tp)` mesh and which of its ranks this process drives.

    Attributes:
      mesh: device mesh of shape (dp ranks, tp shards), devices in process order.
      size: dp ranks (each with its own scheduler and pools).
      tp_size: tensor-parallel shards of the model on each rank.
      local_ranks: global rank ids this process drives, ascending and contiguous.
    """

    mesh: Mesh

    @property
    def size(self) -> int:
        return self.mesh.shape[AXIS]

    @property
    def tp_size(self) -> int:
        return self.mesh.shape[TP_AXIS]

    @functools.cached_property
    def local_ranks(self) -> tuple[int, ...]:
        mine = jax.process_index()
        rows = enumerate(self.mesh.devices)
        return tuple(r for r, row in rows if all(d.process_index == mine for d in row))

    @functools.cached_property
    def drives_every_rank(self) -> bool:
        """Whether this process drives every rank (a single-process run): its rows are the
        whole of every rank-split array."""
        return len(self.local_ranks) == self.size

    @property
    def replicated(self) -> NamedSharding:
        return NamedSharding(self.mesh, P())

    @property
    def by_rank(self) -> NamedSharding:
        """Leading axis split over ranks, replicated over tp (stacked per-rank inputs and
        outputs)."""
        return NamedSharding(self.mesh, P(AXIS))

    @property
    def by_shard(self) -> NamedSharding:
        """Leading axis split over tp shards, replicated over ranks (the parameters, stacked
        [tp, ...] by shard)."""
        return NamedSharding(self.mesh, P(TP_AXIS))

    def pool_spec(self, ndim: int, tp_axis: int) -> P:
        """A cache array's spec: its pool axis (0) over ranks, its `tp_axis` over shards."""
        spec: list[str | None] = [AXIS] + [None] * (ndim - 1)
        spec[tp_axis] = TP_AXIS
        return P(*spec)

    def global_array(self, local: np.ndarray) -> jax.Array:
        """[len(local_ranks), ...] rows of this process's ranks -> the global [size, ...] array."""
        shape = (self.size, *local.shape[1:])
        return jax.make_array_from_process_local_data(self.by_rank, local, shape)

    def step_rows(self, local: np.ndarray) -> np.ndarray | jax.Array:
        """This process's rows as a program whose input is split `by_rank` takes them: the
        numpy rows themselves when this process drives every rank (the program's dispatch
        places them in C++: 0.15-0.20 ms a step less than `global_array` and a copy on the H200's
        host: benchmarks/results/log/2026-11-27.md), else the global array."""
        return local if self.drives_every_rank else self.global_array(local)

    def local_rows(self, array: jax.Array) -> np.ndarray:
        """The rows of a [size, ...] rank-sharded array that belong to this process's ranks (one
        copy of each: the tp shards of a rank hold the same row)."""
        shards = sorted(_first_copies(array), key=lambda s: s.index[0].start or 0)
        return np.concatenate([np.asarray(s.data) for s in shards])

    def start_copy_to_host(self, array: jax.Array) -> None:
        """Enqueue the device-to-host copy of this process's rows of `array` now, so that a later
        `local_rows` waits for this step alone, not for steps dispatched after it."""
        for shard in _first_copies(array):
            shard.data.copy_to_host_async()


def _first_copies(array: jax.Array) -> list:
    """The addressable shards of `array` that are the first copy of their slice."""
    return [s for s in array.addressable_shards if s.replica_id == 0]


def initialize(coordinator_address: str, num_processes: int, process_id: int) -> None:
    """Join a multi-host run: call once per process, before any JAX computation or engine.

    Each process then drives the ranks of its own devices (`DeviceMesh.local_ranks`) and
    serves the requests added to it: requests reach a process through whatever the launcher does
    (each process of `jmamba generate` reads its own prompts; a Python driver might split one list
    by process index), and the process's router places them on its local ranks only. On CPU
    devices the cross-process collectives go through gloo.
    """
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.distributed.initialize(coordinator_address, num_processes, process_id)


def make_mesh(size: int, tp_size: int = 1) -> DeviceMesh:
    """A `(dp, tp)` mesh of `size` x `tp_size` devices (all devices of every process, in process
    order; the shards of a rank are neighbours)."""
    devices = jax.devices()
    count = size * tp_size
    if size < 1 or tp_size < 1 or count > len(devices):
        raise ValueError(
            f"data_parallel_size={size} x tensor_parallel_size={tp_size} must be in "
            f"[1, {len(devices)}] (the devices JAX sees: {len(devices)} {devices[0].platform})"
        )
    if 1 < count < len(devices) and jax.process_count() > 1:
        raise ValueError(
            f"data_parallel_size={size} x tensor_parallel_size={tp_size}: a multi-host run uses "
            f"every device ({len(devices)})"
        )
    ordered = sorted(devices, key=lambda d: (d.process_index, d.id))[:count]
    return DeviceMesh(Mesh(np.array(ordered).reshape(size, tp_size), (AXIS, TP_AXIS)))


def agree_max(local: np.ndarray) -> np.ndarray:
    """Elementwise max of a small int vector over all processes (identity with one process).

    Every process must call it at the same point of every step: it is a collective.
    """
    if jax.process_count() == 1:
        return local
    from jax.experimental import multihost_utils

    return np.asarray(multihost_utils.process_allgather(local)).max(axis=0)


def agree_max_int(local: int) -> int:
    """The largest of every process's `local` (`agree_max` of one int; a collective too)."""
    return int(agree_max(np.array([local], np.int32))[0])
