"""`StepInputs`: all one model step needs besides parameters and caches, as one immutable value.

Plain frozen dataclasses of arrays, with no jax import: the runtime's host side (builder, scheduler)
builds them without loading jax, and `jmamba.step.pytree` registers them as jax pytrees for the
model. The runtime builds a fresh `StepInputs` every step from the scheduler's decision (numpy
arrays allocated at bucket size, filled from scratch); the jitted step consumes it. Every shape is
fixed by the bucket, so a new step never recompiles; every value is an array.

Token layout (T tokens in all):

    [ decode lanes: R_d rows x W lanes, row-major | prefill tokens: T_p | ]
      row 0 lanes 0..W-1, row 1 lanes 0..W-1, ...   row 0 tokens, row 1 tokens, ..., padding

* A decode row is a request past its prompt: 1 + K tokens (K draft tokens), W = 1 + K_max lanes.
  Lanes past `query_lens[r]` and rows past the live ones are padding.
* A prefill row is everything else (a first chunk is always a prefill). Row r owns prefill tokens
  `query_start_loc[r] : query_start_loc[r + 1]`; tokens past `query_start_loc[-1]` are padding.

Sentinel: `NULL = 0`. Block 0 of every KV pool and slot 0 of every state pool are reserved; padding
rows and tokens are NULL / zero / False in every field (docs/architecture.md section 5, "Sentinels
and invariants"). No -1 reaches a device.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import jax
    import numpy as np

    Array = jax.Array | np.ndarray

NULL = 0


@dataclasses.dataclass(frozen=True)
class DecodeRows:
    """The decode section: R_d rows of W = 1 + K_max token lanes.

    Attributes:
      query_lens: [R_d] int32, live lanes of the row (1 + its drafts); 0 for a padding row.
      seq_lens: [R_d] int32, tokens in the request's context after this step; 0 for padding.
      read_slots: [R_d] int32, state slot holding the state before lane 0; NULL for padding.
      write_slots: [R_d, W] int32, slot receiving the state after lane t; NULL for dead lanes.
      block_table: [R_d, max_blocks] int32, attention KV blocks of the row; NULL past its blocks.
    """

    query_lens: Array
    seq_lens: Array
    read_slots: Array
    write_slots: Array
    block_table: Array

    @property
    def num_rows(self) -> int:
        return self.write_slots.shape[0]

    @property
    def width(self) -> int:
        return self.write_slots.shape[1]


@dataclasses.dataclass(frozen=True)
class PrefillRows:
    """The prefill section: R_p rows over T_p ragged tokens.

    Attributes:
      query_start_loc: [R_p + 1] int32, row r owns prefill tokens qsl[r]:qsl[r+1]; padding rows
        have length 0 (the last offset repeats).
      num_computed: [R_p] int32, tokens of the request processed before this step (the absolute
        position of the row's first token here); 0 for padding.
      seq_lens: [R_p] int32, num_computed + query length; 0 for padding.
      has_initial_state: [R_p] bool, num_computed > 0: only then is the read slot's state used.
      read_slots: [R_p] int32, slot holding the state to continue from; NULL for padding.
      write_slots: [R_p] int32, slot receiving the state after the row's last token; NULL for
        padding.
      block_table: [R_p, max_blocks] int32, attention KV blocks of the row; NULL past its blocks.
      boundary_slots: [R_p, NB] int32 or None (prefix caching off). Column j of row r is the
        slot receiving the state after the row's token at absolute position
        (num_computed[r] // state_block_size + j + 1) * state_block_size - 1, the j-th state
        block boundary inside the row; NULL where no state is cached there (and for padding).
      state_block_size: (static) tokens per state block of `boundary_slots`; 0 when None.
    """

    query_start_loc: Array
    num_computed: Array
    seq_lens: Array
    has_initial_state: Array
    read_slots: Array
    write_slots: Array
    block_table: Array
    boundary_slots: Array | None = None
    state_block_size: int = dataclasses.field(default=0, metadata=dict(static=True))

    @property
    def num_rows(self) -> int:
        return self.read_slots.shape[0]


@dataclasses.dataclass(frozen=True)
class NextTokens:
    """What follows each prefill row's chunk, for a head that reads the token after each lane's
    (the MTP head, `jmamba.mtp.next_token_ids`); the decode lanes' next tokens are the step's own
    samples.

    Attributes:
      token_ids: [R_p] int32, the known token after the row's last one (a prompt token the next
        chunk will feed); NULL where the row samples its next token, and for padding.
      samples: [R_p] bool, the row's chunk ends the request's known tokens: the token after it is
        the one this step samples. False for padding.
    """

    token_ids: Array
    samples: Array


@dataclasses.dataclass(frozen=True)
class StepInputs:
    """Inputs of one model step (see the module docstring for the token layout).

    Attributes:
      token_ids: [T] int32 token ids; NULL for padding.
      positions: [T] int32 absolute positions; 0 for padding.
      kv_slots: [T] int32 flat KV-pool index `block * block_size + offset` the token's K/V are
        written to; NULL (block 0, offset 0) for padding.
      decode: the decode section.
      prefill: the prefill section.
      logits_indices: [R_d * W + R_p] int32 token index of every position whose logits are needed:
        each decode lane, then the last token of each prefill row; 0 for padding.
    """

    token_ids: Array
    positions: Array
    kv_slots: Array
    decode: DecodeRows
    prefill: PrefillRows
    logits_indices: Array

    @property
    def num_tokens(self) -> int:
        return self.token_ids.shape[0]

    @property
    def num_decode_tokens(self) -> int:
        return self.decode.num_rows * self.decode.width

    @property
    def num_prefill_tokens(self) -> int:
        return self.num_tokens - self.num_decode_tokens

    def named_arrays(self) -> Iterator[tuple[str, Array]]:
        """Every array with its dotted field name (`decode.read_slots`), in field order (fields
        that are None are left out)."""
        for field in dataclasses.fields(self):
            value = getattr(self, field.name)
            if isinstance(value, DecodeRows | PrefillRows):
                for name in _array_fields(value):
                    yield f"{field.name}.{name}", getattr(value, name)
            else:
                yield field.name, value

    def map_arrays(self, fn: Callable[[Array], Any]) -> StepInputs:
        """A copy with `fn` applied to every array (`np.asarray` brings it to the host)."""

        def mapped(value: Any) -> Any:
            changes = {name: fn(getattr(value, name)) for name in _array_fields(value)}
            return dataclasses.replace(value, **changes)

        return dataclasses.replace(
            self,
            token_ids=fn(self.token_ids),
            positions=fn(self.positions),
            kv_slots=fn(self.kv_slots),
            decode=mapped(self.decode),
            prefill=mapped(self.prefill),
            logits_indices=fn(self.logits_indices),
        )


def _array_fields(rows: DecodeRows | PrefillRows) -> list[str]:
    """The names of a section's array fields (not static fields, not fields that are None)."""
    return [
        f.name
        for f in dataclasses.fields(rows)
        if not f.metadata.get("static") and getattr(rows, f.name) is not None
    ]
