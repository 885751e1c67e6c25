"""`StepBuffers`: the device buffers a step reads and writes, kept at fixed addresses.

On the GPU XLA runs the whole step as one command buffer (a CUDA graph). When any buffer the graph
reads or writes has moved since the graph was recorded, XLA records it again before launching it: on
the H100 that took ~0.2 ms for the 1b decode step's 179 commands, and the launch that follows is
slower too (benchmarks/results/log/2026-11-23.md: a chain of 170 kernels returned after 219-297 us
with fresh buffers every call, 66-77 us with donated ones). So nothing the step touches is allocated
per step:

    what              lives                           how the step sees it
    ----------------  ------------------------------  ----------------------------------------
    parameters        the runner's life               read only
    caches            the runner's life               donated, written in place
    packed inputs     one slot per variant            read only; `upload` copies each step's
                                                      rows into the slot
    outputs           one set per variant             donated, written in place; `download`
                                                      copies them out for the host
    carried tokens,   one [ranks, depth, C] for all   donated, read then written in place
    drafts, shifts    variants

`upload` and `download` are programs of one copy each, outside the step's graph, so the step's
graph sees the same addresses every call. In a single-process run `upload` takes the step's
numpy rows as they are (`DeviceMesh.step_rows`): its dispatch moves them to the device in C++,
where building a global array first in Python cost 0.15-0.20 ms a step more on the H200's host.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from runtime.core.sampling_inputs import TokenLogprobs
from runtime.device.distributed import DeviceMesh


class StepOutputs(NamedTuple):
    """What a step hands back to the host, per rank on axis 0: tokens [R, 2 (+ 1 + k), N]
    (sampled tokens and draft-accept flags, then, when the step drafts, the next step's drafts:
    `runtime.device.mtp_drafts`; one array, so one copy to the host a step), log-probabilities
    when its sampling mode asks for them, logits [R, N, V] when the runner keeps them; else
    None."""

    tokens: jax.Array
    token_logprobs: TokenLogprobs[jax.Array] | None
    logits: jax.Array | None


def _overwrite(slot: jax.Array, fresh: jax.Array) -> jax.Array:
    return jax.lax.dynamic_update_slice(slot, fresh, (0,) * slot.ndim)


def buffer_addresses(tree: Any) -> list[int]:
    """Device addresses of every local shard of every array in `tree`."""
    return [
        shard.data.unsafe_buffer_pointer()
        for array in jax.tree.leaves(tree)
        for shard in array.addressable_shards
    ]


_download = jax.jit(lambda outputs: jax.tree.map(jnp.copy, outputs))  # fresh buffers


class StepBuffers:
    """The packed-input slots and output buffers of every compiled variant, and the carried
    tokens, each on the mesh split by rank. Keys are the runner's variant keys."""

    def __init__(self, mesh: DeviceMesh, carried_shape: tuple[int, int]):
        """`carried_shape`: (depth, C), what a step hands the next for each of C logits
        rows (`runtime.device.chaining`)."""
        self._mesh = mesh
        by_rank = mesh.by_rank  # numpy rows (`DeviceMesh.step_rows`) are placed by the dispatch
        self._upload = jax.jit(  # the result lands in the slot's buffer
            _overwrite, donate_argnums=0, in_shardings=(by_rank, by_rank), out_shardings=by_rank
        )
        self._packed: dict[Any, jax.Array] = {}
        self._outputs: dict[Any, StepOutputs] = {}
        self.carried = self._zeros(jax.ShapeDtypeStruct((mesh.size, *carried_shape), np.int32))

    def add_variant(
        self, key: Any, packed: jax.Array | jax.ShapeDtypeStruct, outputs: StepOutputs
    ) -> StepOutputs:
        """Make `key`'s buffers, zeroed: its input slot shaped like `packed` (an array or its
        shape), its outputs shaped like `outputs` (ShapeDtypeStructs). Returns the output
        buffers."""
        self._packed[key], self._outputs[key] = self._zeros((packed, outputs))
        return self._outputs[key]

    def _zeros(self, shapes: Any) -> Any:
        """Zeroed arrays shaped like `shapes` ([ranks, ...] each), split by rank."""
        local = len(self._mesh.local_ranks)
        return jax.tree.map(
            lambda s: self._mesh.global_array(np.zeros((local, *s.shape[1:]), s.dtype)), shapes
        )

    def upload(self, key: Any, fresh: np.ndarray | jax.Array) -> jax.Array:
        """Copy this step's packed inputs (`DeviceMesh.step_rows`) into `key`'s slot; returns
        the slot."""
        self._packed[key] = self._upload(self._packed[key], fresh)
        return self._packed[key]

    def outputs(self, key: Any) -> StepOutputs:
        """`key`'s output buffers, to be donated to its step (hand the step's outputs back with
        `keep`)."""
        return self._outputs[key]

    def keep(self, key: Any, outputs: StepOutputs, carried: jax.Array) -> None:
        """The step's outputs (written where `outputs`' buffers were) and its carried
        tokens."""
        self._outputs[key] = outputs
        self.carried = carried

    def addresses(self, key: Any) -> list[int]:
        """Device addresses of `key`'s input slot, output buffers and the carried tokens (the
        buffers of a step that must not move between calls)."""
        return buffer_addresses((self._packed[key], self._outputs[key], self.carried))

    @staticmethod
    def download(outputs: StepOutputs) -> StepOutputs:
        """Copies of `outputs` the next step will not overwrite, for the host to fetch."""
        return _download(outputs)
