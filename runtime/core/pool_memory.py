"""`PoolMemory`: how many KV blocks fit beside the parameters and state slots of one device.

With `EngineConfig.gpu_memory_utilization = u` and no `num_blocks`, the pools are sized from what
one device may use (a rank's share of each pool sits on each of its tensor-parallel devices, one
shard of its heads):

    state slots  = what the requests need (`num_slots`, resolved as without memory sizing)
    KV blocks    = floor((u * device bytes - parameter bytes - slots * slot bytes) / block bytes)

with the bytes of one device: its parameter shard, one block of every attention layer's K and V
(its KV heads), one slot of every recurrent layer's conv and recurrent state (its heads). What the
step itself allocates (activations, XLA's temporaries) must fit in the 1 - u left over. A model
without attention layers needs no blocks beyond NULL and its minimum. Host-side and jax-free:
`runtime.device.memory` measures the bytes.
"""

from __future__ import annotations

import dataclasses

MIB = 1 << 20


@dataclasses.dataclass(frozen=True)
class PoolMemory:
    """Bytes of one device that size the pools.

    Attributes:
      device_bytes: the device's memory (the allocator's limit).
      param_bytes: this device's parameter shard.
      block_bytes: one KV block of every attention layer (K and V, this device's KV heads); 0
        without attention.
      slot_bytes: one state slot of every recurrent layer (conv and recurrent state, this
        device's heads); 0 without recurrent layers.
    """

    device_bytes: int
    param_bytes: int
    block_bytes: int
    slot_bytes: int

    def num_blocks(self, utilization: float, num_slots: int, needed: int) -> int:
        """KV blocks (NULL included) in what `utilization` of the device leaves beside the
        parameters and `num_slots` slots; ValueError when fewer than `needed` (one request of
        max_model_len) fit."""
        left = int(utilization * self.device_bytes) - self.param_bytes - num_slots * self.slot_bytes
        blocks = left // self.block_bytes if self.block_bytes else needed
        if blocks < needed:
            raise ValueError(
                f"gpu_memory_utilization={utilization} of {self.device_bytes / MIB:.0f} MiB leaves "
                f"{max(left, 0) / MIB:.1f} MiB beside {self.param_bytes / MIB:.1f} MiB of "
                f"parameters and {num_slots} state slots of {self.slot_bytes / MIB:.2f} MiB: "
                f"{max(blocks, 0)} KV blocks of {self.block_bytes / MIB:.3f} MiB, fewer than the "
                f"{needed} one request of max_model_len needs (with NULL). Lower max_model_len or "
                "max_num_seqs, raise gpu_memory_utilization, or split the model over more devices "
                "(tensor_parallel_size)"
            )
        return blocks

    def describe(self, num_blocks: int, num_slots: int) -> str:
        """One line for start-up: the pools and their bytes per device."""
        pools = num_blocks * self.block_bytes + num_slots * self.slot_bytes
        return (
            f"per device: {self.param_bytes / MIB:.1f} MiB parameters, {num_blocks} KV blocks x "
            f"{self.block_bytes / MIB:.3f} MiB + {num_slots} state slots x "
            f"{self.slot_bytes / MIB:.3f} MiB = {pools / MIB:.1f} MiB of "
            f"{self.device_bytes / MIB:.0f} MiB"
        )
