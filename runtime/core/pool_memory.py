"""`PoolMemory`: how many KV blocks fit beside the parameters, activations and state slots of one
device.

With `EngineArgs.gpu_memory_utilization = u` and no `num_blocks`, the pools are sized from what
one device may use (a rank's share of each pool sits on each of its tensor-parallel devices, one
shard of its heads):

    state slots  = what the requests need (`num_slots`, resolved as without memory sizing)
    KV blocks    = floor((u * device bytes - parameter bytes - activation bytes
                          - slots * slot bytes) / block bytes)

with the bytes of one device: its parameter shard, the peak activations of the largest step
bucket (`peak_activation_bytes`), one block of every attention layer's K and V (its KV heads,
in `kv_cache_dtype`: an fp8 block is half a bf16 one), one slot of every recurrent layer's conv
and recurrent state (its heads; the recurrent state in `state_dtype`: bf16 halves it). What else
the step allocates (XLA's temporaries, fragmentation) must fit in the 1 - u left over. A model
without attention layers needs no blocks beyond NULL and its minimum, but its slots must still fit.
Host-side and jax-free: `runtime.device.memory` measures the bytes.
"""

from __future__ import annotations

import dataclasses

MIB = 1 << 20


def peak_activation_bytes(
    token_bytes: int, logits_row_bytes: int, step_tokens: int, logits_rows: int
) -> int:
    """The activation bytes one device reserves for a step of `step_tokens` token lanes that
    computes `logits_rows` rows of logits: whichever is larger of the layers' activations
    (`step_tokens` x `token_bytes`, the widest layer's per-token fp32 intermediates beside the
    residual stream: `runtime.device.memory.activation_token_bytes`) and the logits
    (`logits_rows` x `logits_row_bytes`, fp32 logits and their softmax over this device's
    vocabulary shard). The two do not live at once: the logits come after the last layer."""
    return max(step_tokens * token_bytes, logits_rows * logits_row_bytes)


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
      token_bytes: activation bytes per token lane of a step (`peak_activation_bytes`).
      logits_row_bytes: activation bytes per row of logits (`peak_activation_bytes`).
    """

    device_bytes: int
    param_bytes: int
    block_bytes: int
    slot_bytes: int
    token_bytes: int
    logits_row_bytes: int

    def activation_bytes(self, step_tokens: int, logits_rows: int) -> int:
        """`peak_activation_bytes` of a step of this size."""
        return peak_activation_bytes(
            self.token_bytes, self.logits_row_bytes, step_tokens, logits_rows
        )

    def num_blocks(
        self, utilization: float, num_slots: int, needed: int, *, step_tokens: int, logits_rows: int
    ) -> int:
        """KV blocks (NULL included) in what `utilization` of the device leaves beside the
        parameters, the activations of a step of `step_tokens` lanes and `logits_rows` logits
        rows, and `num_slots` slots; ValueError when fewer than `needed` (one request of
        max_model_len) fit, or, without attention, when the slots do not fit."""
        activations = self.activation_bytes(step_tokens, logits_rows)
        taken = self.param_bytes + activations + num_slots * self.slot_bytes
        left = int(utilization * self.device_bytes) - taken
        blocks = left // self.block_bytes if self.block_bytes else (needed if left >= 0 else 0)
        if blocks < needed:
            raise ValueError(
                f"gpu_memory_utilization={utilization} of {self.device_bytes / MIB:.0f} MiB leaves "
                f"{max(left, 0) / MIB:.1f} MiB beside {self.param_bytes / MIB:.1f} MiB of "
                f"parameters, {activations / MIB:.1f} MiB of activations (a step of "
                f"{step_tokens} tokens) and {num_slots} state slots of "
                f"{self.slot_bytes / MIB:.2f} MiB: {max(blocks, 0)} KV blocks of "
                f"{self.block_bytes / MIB:.3f} MiB, fewer than the {needed} one request of "
                "max_model_len needs (with NULL). Lower max_model_len, max_num_seqs or "
                "max_num_batched_tokens, raise gpu_memory_utilization, or split the model over "
                "more devices (tensor_parallel_size)"
            )
        return blocks

    def describe(self, num_blocks: int, num_slots: int) -> str:
        """One line: the pools and their bytes per device."""
        pools = num_blocks * self.block_bytes + num_slots * self.slot_bytes
        return (
            f"per device: {self.param_bytes / MIB:.1f} MiB parameters, {num_blocks} KV blocks x "
            f"{self.block_bytes / MIB:.3f} MiB + {num_slots} state slots x "
            f"{self.slot_bytes / MIB:.3f} MiB = {pools / MIB:.1f} MiB of "
            f"{self.device_bytes / MIB:.0f} MiB"
        )
