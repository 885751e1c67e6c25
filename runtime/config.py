"""`EngineConfig`: the budgets and pool sizes of one engine, checked once at construction."""

from __future__ import annotations

import dataclasses
import math

from runtime import checks
from runtime.speculative import SpeculativeConfig, default_num_slots, min_num_slots

DEFAULT_MIN_TOKEN_BUDGET = 256  # the smallest derived token budget (the tiny presets get this)


def powers_of_two_up_to(limit: int, start: int = 1) -> tuple[int, ...]:
    """Return (start, 2*start, 4*start, ...) with the last entry >= limit."""
    sizes = [start]
    while sizes[-1] < limit:
        sizes.append(sizes[-1] * 2)
    return tuple(sizes)


def min_token_budget(chunk_size: int, max_num_seqs: int) -> int:
    """The smallest token budget with room for one full prefill chunk beside a full decode batch.

    A step holds at most max_num_seqs rows; when one of them is a prefill, at most
    max_num_seqs - 1 decode lanes run beside it. The scheduler's fairness bound rests on this.
    """
    return chunk_size + max_num_seqs - 1


def default_token_budget(chunk_size: int, max_num_seqs: int) -> int:
    """The derived budget: a power of two (a bucket size), at least 256 and the minimum above."""
    needed = max(DEFAULT_MIN_TOKEN_BUDGET, min_token_budget(chunk_size, max_num_seqs))
    return powers_of_two_up_to(needed)[-1]


@dataclasses.dataclass(frozen=True)
class EngineConfig:
    """Engine budgets, pool sizes and bucket tables.

    Attributes:
      max_num_seqs: most requests in one step (decode rows + prefill rows).
      max_num_batched_tokens: token budget of one step (live decode lanes + prefill tokens); at
        least the model's chunk_size + max_num_seqs - 1 (one full chunk beside a full decode
        batch). None derives it from the model's chunk size (`default_token_budget`) when the
        engine is built (`resolved`).
      max_model_len: longest sequence (prompt + generated tokens) a request may reach.
      block_size: tokens per attention KV block.
      num_blocks: KV blocks per attention layer, block 0 (NULL) included; None sizes the pool so
        that every request can reach max_model_len.
      num_slots: recurrent-state slots per recurrent layer, slot 0 (NULL) included; None gives
        max_num_seqs + 1, and with speculative decoding 1 + max_num_seqs * (2 + K): each request
        holds one slot, and each decode row takes 1 + K fresh lane slots during a step (the state
        after each lane, kept or given back after verification). With speculation at least
        1 + 2 * max_num_seqs; fewer than the default trims drafts to the slots left.
      decode_row_buckets / prefill_token_buckets / prefill_row_buckets: padded sizes of the step
        sections; None picks powers of two up to the budgets.
      data_parallel_size: ranks of the data-parallel mesh (one device each). Every pool size,
        max_num_seqs and max_num_batched_tokens above is per rank: each rank has its own scheduler,
        its own KV blocks and state slots (each with its own NULL block and slot 0).
      seed: seeds the sampling of requests that set no seed of their own.
      validate_inputs: check every step's `StepInputs` against DESIGN.md section 5 (debug, tests).
      speculative: speculative decoding (`runtime.speculative.SpeculativeConfig`, or a dict of its
        fields); None decodes one token per request per step.
    """

    max_num_seqs: int = 8
    max_num_batched_tokens: int | None = None
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
    speculative: SpeculativeConfig | None = None

    def __post_init__(self) -> None:
        checks.integer("max_num_seqs", self.max_num_seqs, low=1)
        # One prompt token and one generated token at least: prompt + output <= max_model_len.
        checks.integer("max_model_len", self.max_model_len, low=2)
        checks.integer("block_size", self.block_size, low=1)
        checks.integer("seed", self.seed, low=0)
        checks.integer("data_parallel_size", self.data_parallel_size, low=1)
        checks.flag("validate_inputs", self.validate_inputs)
        if self.max_num_batched_tokens is not None:
            checks.integer("max_num_batched_tokens", self.max_num_batched_tokens, low=1)
        blocks = self.num_blocks if self.num_blocks is not None else self._default_num_blocks
        object.__setattr__(self, "num_blocks", checks.integer("num_blocks", blocks, low=2))
        if self.num_blocks - 1 < self.max_blocks_per_seq:
            raise ValueError(
                f"num_blocks={self.num_blocks} must be >= {self.max_blocks_per_seq + 1}: one "
                f"request of max_model_len={self.max_model_len} needs "
                f"{self.max_blocks_per_seq} blocks of block_size={self.block_size} + NULL"
            )
        speculative = SpeculativeConfig.of(self.speculative)
        object.__setattr__(self, "speculative", speculative)
        slots = self.num_slots
        if slots is None:
            slots = default_num_slots(self.max_num_seqs, speculative)
        low = min_num_slots(self.max_num_seqs, speculative)
        object.__setattr__(self, "num_slots", checks.integer("num_slots", slots, low=low))
        seqs, tokens = self.max_num_seqs, self.max_num_batched_tokens
        self._set_buckets("decode_row_buckets", powers_of_two_up_to(seqs), seqs)
        self._set_buckets("prefill_row_buckets", powers_of_two_up_to(seqs), seqs)
        if tokens is not None:
            self._set_buckets("prefill_token_buckets", powers_of_two_up_to(tokens, 8), tokens)

    def resolved(self, chunk_size: int) -> EngineConfig:
        """This config with the token budget derived from the model's chunk size if it is None."""
        if self.max_num_batched_tokens is not None:
            return self
        budget = default_token_budget(chunk_size, self.max_num_seqs)
        return dataclasses.replace(self, max_num_batched_tokens=budget)

    def _set_buckets(self, name: str, default: tuple[int, ...], needed: int) -> None:
        buckets = getattr(self, name)
        if buckets is None:
            buckets = default
        elif isinstance(buckets, str) or not isinstance(buckets, tuple | list):
            raise ValueError(f"{name}={buckets!r} must be a tuple of ints")
        else:
            buckets = tuple(sorted({checks.integer(f"{name} entry", b, low=1) for b in buckets}))
        if not buckets or buckets[-1] < needed:
            raise ValueError(f"{name}={buckets} must be positive sizes reaching at least {needed}")
        object.__setattr__(self, name, buckets)

    @property
    def _default_num_blocks(self) -> int:
        return self.max_num_seqs * self.max_blocks_per_seq + 1

    @property
    def max_blocks_per_seq(self) -> int:
        """Width of every block-table row."""
        return math.ceil(self.max_model_len / self.block_size)
