"""`prefill_inputs`: the `StepInputs` of one prefill row, for running the model alone (no jax).

The serving runtime builds every step's inputs from its scheduler (`runtime.builder`); a notebook
or a test that calls `model(inputs, caches)` directly needs one row by hand. Here the row's state
lives in one slot and its KV cache in blocks 1, 2, ... in order (block 0 and slot 0 are NULL), so
a later call with `start=` continues the same sequence from the caches the first one returned.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from jmamba.step.inputs import DecodeRows, PrefillRows, StepInputs


def prefill_inputs(
    token_ids: Sequence[int],
    *,
    block_size: int = 16,
    slot: int = 1,
    start: int = 0,
    max_blocks: int | None = None,
    all_logits: bool = False,
) -> StepInputs:
    """One prefill row: `token_ids` at positions start, start + 1, ...

    Args:
      token_ids: the tokens to run (at least one).
      block_size: tokens per KV block; the caches must be made with the same value and hold at
        least `1 + ceil((start + len(token_ids)) / block_size)` blocks.
      slot: the state slot the row writes (and reads when `start > 0`); >= 1.
      start: tokens of the sequence already in the caches (0 for a fresh prompt). For a
        recurrent model a continuation must start on a multiple of its `chunk_size`.
      max_blocks: width of the block table; None fits the sequence exactly.
      all_logits: logits for every token, else for the last one only (the runtime's layout:
        `check_step_inputs` expects one logits index per row, so it refuses this one).
    Returns:
      A `StepInputs` with no decode row and one prefill row; its logits are
      `[len(token_ids) or 1, vocab]`.
    """
    tokens = np.asarray(token_ids, np.int32)
    n = tokens.size
    if tokens.ndim != 1 or n == 0:
        raise ValueError(f"token_ids must be a non-empty flat list of ids, shape {tokens.shape}")
    if block_size < 1 or slot < 1 or start < 0:
        raise ValueError(
            f"block_size={block_size} and slot={slot} must be >= 1, start={start} >= 0"
        )
    num_blocks = -(-(start + n) // block_size)
    width = num_blocks if max_blocks is None else max_blocks
    if width < num_blocks:
        raise ValueError(f"max_blocks={max_blocks} is below the {num_blocks} blocks the row needs")
    positions = np.arange(start, start + n, dtype=np.int32)
    blocks = np.arange(1, num_blocks + 1, dtype=np.int32)  # block b holds positions of block b-1
    table = np.zeros((1, width), np.int32)
    table[0, :num_blocks] = blocks

    def i32(*values: int) -> np.ndarray:
        return np.array(values, np.int32)

    return StepInputs(
        token_ids=tokens,
        positions=positions,
        kv_slots=blocks[positions // block_size] * block_size + positions % block_size,
        decode=DecodeRows(
            i32(), i32(), i32(), np.zeros((0, 1), np.int32), np.zeros((0, width), np.int32)
        ),
        prefill=PrefillRows(
            query_start_loc=i32(0, n),
            num_computed=i32(start),
            seq_lens=i32(start + n),
            has_initial_state=np.array([start > 0]),
            read_slots=i32(slot if start > 0 else 0),
            write_slots=i32(slot),
            block_table=table,
        ),
        logits_indices=np.arange(n, dtype=np.int32) if all_logits else i32(n - 1),
    )
