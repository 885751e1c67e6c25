"""`EngineConfig`: the budgets and pool sizes of one engine, checked once at construction."""

from __future__ import annotations

import dataclasses
import math


def powers_of_two_up_to(limit: int, start: int = 1) -> tuple[int, ...]:
    """Return (start, 2*start, 4*start, ...) with the last entry >= limit."""
    sizes = [start]
    while sizes[-1] < limit:
        sizes.append(sizes[-1] * 2)
    return tuple(sizes)


@dataclasses.dataclass(frozen=True)
class EngineConfig:
    """Engine budgets, pool sizes and bucket tables.

    Attributes:
      max_num_seqs: most requests in one step (decode rows + prefill rows).
      max_num_batched_tokens: token budget of one step (live decode lanes + prefill tokens).
      max_model_len: longest sequence (prompt + generated tokens) a request may reach.
      block_size: tokens per attention KV block.
      num_blocks: KV blocks per attention layer, block 0 (NULL) included; None sizes the pool so
        that every request can reach max_model_len.
      num_slots: recurrent-state slots per recurrent layer, slot 0 (NULL) included; None gives
        max_num_seqs + 1.
      decode_row_buckets / prefill_token_buckets / prefill_row_buckets: padded sizes of the step
        sections; None picks powers of two up to the budgets.
      data_parallel_size: ranks of the data-parallel mesh (one device each). Every pool size,
        max_num_seqs and max_num_batched_tokens above is per rank: each rank has its own scheduler,
        its own KV blocks and state slots (each with its own NULL block and slot 0).
      seed: seeds the sampling of requests that set no seed of their own.
      validate_inputs: check every step's `StepInputs` against DESIGN.md section 5 (debug, tests).
    """

    max_num_seqs: int = 8
    max_num_batched_tokens: int = 256
    max_model_len: int = 512
    block_size: int = 16
    num_blocks: int | None = None
    num_slots: int | None = None
    decode_row_buckets: tuple[int, ...] | None = None
    prefill_token_buckets: tuple[int, ...] | None = None
    prefill_row_buckets: tuple[int, ...] | None = None
    data_parallel_size: int = 1
    seed: int = 0
    validate_inputs: bool = False

    def __post_init__(self) -> None:
        for name in ("max_num_seqs", "max_num_batched_tokens", "max_model_len", "block_size",
                     "data_parallel_size"):  # fmt: skip
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"{name}={value!r} must be an int >= 1")
        if self.num_blocks is None:
            object.__setattr__(self, "num_blocks", self.max_num_seqs * self.max_blocks_per_seq + 1)
        if self.num_slots is None:
            object.__setattr__(self, "num_slots", self.max_num_seqs + 1)
        if self.num_blocks - 1 < self.max_blocks_per_seq:
            raise ValueError(
                f"num_blocks={self.num_blocks} must be >= {self.max_blocks_per_seq + 1}: one "
                f"request of max_model_len={self.max_model_len} needs "
                f"{self.max_blocks_per_seq} blocks of block_size={self.block_size} + NULL"
            )
        if self.num_slots < 2:
            raise ValueError(f"num_slots={self.num_slots} must be >= 2 (slot 0 is NULL)")
        seqs, tokens = self.max_num_seqs, self.max_num_batched_tokens
        self._set_buckets("decode_row_buckets", powers_of_two_up_to(seqs), seqs)
        self._set_buckets("prefill_token_buckets", powers_of_two_up_to(tokens, 8), tokens)
        self._set_buckets("prefill_row_buckets", powers_of_two_up_to(seqs), seqs)

    def _set_buckets(self, name: str, default: tuple[int, ...], needed: int) -> None:
        buckets = getattr(self, name)
        buckets = default if buckets is None else tuple(sorted(set(int(b) for b in buckets)))
        if not buckets or buckets[0] < 1 or buckets[-1] < needed:
            raise ValueError(f"{name}={buckets} must be positive sizes reaching at least {needed}")
        object.__setattr__(self, name, buckets)

    @property
    def max_blocks_per_seq(self) -> int:
        """Width of every block-table row."""
        return math.ceil(self.max_model_len / self.block_size)
