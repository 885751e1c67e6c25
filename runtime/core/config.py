"""`EngineConfig`: one engine's budgets, pool sizes and bucket tables, resolved for its model.

Every field has its final value: `EngineArgs.resolved` (runtime/core/engine_args.py) derives each
one the user left to the engine, once, from the model's chunk size and length and the device's
memory, and checks it. The engine, its runner and its schedulers read this type and derive
nothing again. The meaning of each field is documented on `EngineArgs`.
"""

from __future__ import annotations

import dataclasses

from jmamba.cache_dtypes import CacheDtypes
from runtime.core.kv_events_config import KVEventsConfig
from runtime.core.model_len import blocks_per_seq
from runtime.core.speculative_config import SpeculativeConfig

PREFIX_CACHING_MODES = ("off", "align", "all")

# The fields that fix a compiled step (shapes, how it rounds) and the pool sizes of its caches:
# engines may share a runner when these agree (`EngineConfig.check_same_shapes`).
STEP_SHAPE_FIELDS = (
    "block_size",
    "max_model_len",
    "decode_row_buckets",
    "prefill_token_buckets",
    "prefill_row_buckets",
    "data_parallel_size",
    "tensor_parallel_size",
    "batch_invariant",
    "kv_cache_dtype",  # the caches' dtypes: the step's operand types and how it rounds
    "state_dtype",
    "vocab_size",  # the allowed-token bitmask's width
)
POOL_SIZE_FIELDS = ("num_blocks", "num_slots")

# Threads compiling step variants at once in a warm-up (`ModelRunner.warmup`: XLA compiles without
# the GIL; more than a few gain little, each compile already uses several cores).
COMPILE_WORKERS = 4

# The most decode steps one program may run (`EngineArgs.decode_steps`): past a few dozen the host
# time it saves is a sliver of the program's, and a stop inside it wastes more device time.
MAX_DECODE_STEPS = 64
# `LLM`'s and the CLI's decode steps a program: on the H100 four ran the 0.87B bench model's
# decode at B = 1 in 0.82 ms a step against 1.38 asynchronous (eight: no faster), 1.13 against
# 1.59 at B = 16 (benchmarks/results/README.md, "Multi-step decode").
DEFAULT_DECODE_STEPS = 4


@dataclasses.dataclass(frozen=True)
class EngineConfig:
    """An engine's resolved settings (see `EngineArgs` for what each field means).

    Attributes beyond `EngineArgs`' fields:
      chunk_size: the model's chunk size the config was resolved for (prefill chunks end on its
        multiples, or on state_block_size's in "align" mode).
      prefix_caching: the mode in force, "off", "align" or "all" (never None here).
      kv_cache_dtype: "auto" or "fp8" (an alias resolved).
      vocab_size: the model's vocabulary (logits columns), the width of every step's
        allowed-token bitmask; 0 for a config resolved without a model (no bitmask).
    """

    max_num_seqs: int
    max_num_batched_tokens: int
    max_model_len: int
    block_size: int
    num_blocks: int
    num_slots: int
    decode_row_buckets: tuple[int, ...]
    prefill_token_buckets: tuple[int, ...]
    prefill_row_buckets: tuple[int, ...]
    bucket_table: str
    data_parallel_size: int
    tensor_parallel_size: int
    gpu_memory_utilization: float | None
    seed: int
    validate_inputs: bool
    step_records: int
    freeze_gc: bool
    prefix_caching: str
    state_block_size: int
    max_cached_states: int
    speculative: SpeculativeConfig | None
    async_scheduling: bool
    decode_steps: int
    one_sampler_program: bool
    batch_invariant: bool
    kv_cache_dtype: str
    state_dtype: str
    chunk_size: int
    vocab_size: int = 0
    kv_events_config: KVEventsConfig | None = None

    def check_same_shapes(self, other: EngineConfig, whose: str) -> None:
        """ValueError unless `other` (`whose` config) has this config's pool sizes and bucket
        tables: the shapes of compiled steps and caches that engines may share."""
        for name in (*POOL_SIZE_FIELDS, *STEP_SHAPE_FIELDS, "boundary_block_size"):
            theirs, ours = getattr(other, name), getattr(self, name)
            if theirs != ours:
                raise ValueError(f"{name}={ours} differs from {whose}'s {theirs}")

    @property
    def cache_dtypes(self) -> CacheDtypes:
        """The dtypes of the KV pools and recurrent states (`jmamba.cache_dtypes`)."""
        return CacheDtypes(self.kv_cache_dtype, self.state_dtype)

    @property
    def num_speculative_tokens(self) -> int:
        """K, the most drafts a decode row takes in one step (0 without speculative decoding)."""
        return 0 if self.speculative is None else self.speculative.num_speculative_tokens

    @property
    def decode_width(self) -> int:
        """Lanes of a decode row with the most drafts, 1 + K (1 without speculation)."""
        return 1 + self.num_speculative_tokens

    @property
    def caches_prefixes(self) -> bool:
        """Whether prefix caching is on."""
        return self.prefix_caching != "off"

    @property
    def boundary_block_size(self) -> int:
        """The block size of the prefill rows' boundary slots: state_block_size when prefix
        caching is on, 0 (no boundary slots) when it is off."""
        return self.state_block_size if self.caches_prefixes else 0

    @property
    def ends_chunk_at_last_boundary(self) -> bool:
        """Whether a prefill chunk stops at the last state block boundary of a prompt ("align":
        the state there must be a chunk end to be cached)."""
        return self.prefix_caching == "align"

    @property
    def prefill_alignment(self) -> int:
        """Where prefill chunks may end (besides the end of a prompt): multiples of the model's
        chunk size, or of state_block_size in "align" mode."""
        return self.state_block_size if self.prefix_caching == "align" else self.chunk_size

    @property
    def largest_step(self) -> tuple[int, int]:
        """(token lanes, logits rows) of the largest step bucket: the largest prefill token
        bucket or decode lanes, and every row's sampled lanes."""
        decode_rows = self.decode_row_buckets[-1]
        tokens = max(self.prefill_token_buckets[-1], decode_rows * self.decode_width)
        return tokens, decode_rows * self.decode_width + self.prefill_row_buckets[-1]

    @property
    def max_blocks_per_seq(self) -> int:
        """Width of every block-table row."""
        return blocks_per_seq(self.max_model_len, self.block_size)
