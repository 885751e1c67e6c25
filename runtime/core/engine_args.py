"""`EngineArgs`: what a user asks of an engine, `None` meaning "derive it".

`EngineArgs.resolved` (or `for_model`) turns it into the `EngineConfig` an engine runs with, once:
every derived value (max_model_len, the token budget, pool sizes, bucket tables, the prefix
caching mode, the state block size) comes from the model's chunk size and length and, with
`gpu_memory_utilization`, from the device's memory (`runtime.core.pool_memory.PoolMemory`).
Values are checked when the args are made (a ValueError naming the field and what it allows);
what needs the model is checked when they are resolved.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from jmamba.cache_dtypes import CacheDtypes
from jmamba.config import ModelConfig
from runtime.core import checks
from runtime.core.bucket_tables import BUCKET_TABLES, BucketTables, default_tables
from runtime.core.budgets import default_token_budget, min_token_budget
from runtime.core.config import MAX_DECODE_STEPS, EngineConfig
from runtime.core.kv_events_config import KVEventsConfig
from runtime.core.model_len import blocks_per_seq, default_num_blocks, resolve_max_model_len
from runtime.core.pool_memory import PoolMemory
from runtime.core.prefix_caching_args import (
    check_prefix_caching,
    kv_events,
    prefix_caching,
    state_block_size,
)
from runtime.core.speculative_config import (
    SpeculativeConfig,
    chained_lane_slots,
    default_num_slots,
    min_num_slots,
)


@dataclasses.dataclass(frozen=True)
class EngineArgs:
    """Engine budgets, pool sizes and bucket tables as the user asks for them.

    Attributes:
      max_num_seqs: most requests in one step (decode rows + prefill rows).
      max_num_batched_tokens: token budget of one step (live decode lanes + prefill tokens); at
        least the model's chunk_size + max_num_seqs - 1 (one full chunk beside a full decode
        batch). None derives it from the model's chunk size (`default_token_budget`) when the
        engine is built (`resolved`).
      max_model_len: longest sequence (prompt + generated tokens) a request may reach. None: the
        checkpoint's max_position_embeddings, taken when the engine is built (`resolved`); a
        value above the checkpoint's is refused there (`runtime.core.model_len`).
      block_size: tokens per attention KV block.
      num_blocks: KV blocks per attention layer, block 0 (NULL) included; None sizes the pool so
        that every request can reach max_model_len, or, with gpu_memory_utilization, from memory.
        Without memory sizing and with max_model_len None, the pool has room for max_num_seqs
        requests of min(the checkpoint's length, 512) tokens and at least one of the full length
        (`model_len.default_num_blocks`): a long-context checkpoint's default does not make a
        pool of max_num_seqs full-length requests; give num_blocks, max_model_len or
        gpu_memory_utilization for more.
      gpu_memory_utilization: fraction of each device's memory the parameters and pools may take
        (vLLM's 0.9 leaves room for XLA's temporaries): with num_blocks None, the KV blocks are
        what it leaves beside the parameter shard, the largest step's activations and the state
        slots (`runtime.core.pool_memory`), a ValueError when not even one request of
        max_model_len fits. None (the default): num_blocks as above. Needs a device that
        reports its memory (a GPU; not the CPU).
      num_slots: recurrent-state slots per recurrent layer, slot 0 (NULL) included: one per
        running request, with speculative decoding 1 + K fresh lane slots per decode row during
        a step (the state after each lane, kept or given back after verification), plus the
        prefix cache's `max_cached_states`. None gives exactly that: 1 + max_num_seqs * (1, or
        2 + K with speculation, 3 + 2K when MTP drafting steps chain asynchronously: two rows'
        lanes at once) + max_cached_states, derived by `resolved`. With speculation at least
        1 + 2 * max_num_seqs (+ max_cached_states); fewer than the default trims drafts to the
        slots left.
      decode_row_buckets / prefill_token_buckets / prefill_row_buckets: padded sizes of the step
        sections; None takes `bucket_table`'s. Decode rows start at 2 or more: XLA rewrites a
        one-row matmul into a multiply + reduce at 35-45% of bandwidth (H100: the 0.87B bench
        model's decode step took 2.89 ms device time at 1 row, 2.03 ms at 2).
      bucket_table: the tables not given (`runtime.core.bucket_tables`): "fine" (powers of two
        up to the budgets) or "serving" (powers of four: a few programs, all warmed by
        `warmup(prefill=True)`; `jmamba serve`'s).
      data_parallel_size: ranks of the data-parallel mesh (one device each). Every pool size,
        max_num_seqs and max_num_batched_tokens above is per rank: each rank has its own scheduler,
        its own KV blocks and state slots (each with its own NULL block and slot 0).
      tensor_parallel_size: devices each rank's model is split over (tensor and expert
        parallelism, `jmamba.sharding`): the mesh has data_parallel_size x tensor_parallel_size
        devices. Pool sizes count requests' blocks and slots as before; each device holds its
        shard of every one (its KV heads, its state heads). The model's head, group, channel and
        expert counts must split (a ValueError names the field and the sizes that work).
      seed: seeds the sampling of requests that set no seed of their own.
      validate_inputs: check every step's `StepInputs` against the invariants of
        docs/architecture.md ("Sentinels and invariants"); for debugging and tests.
      step_records: how many `StepRecord`s of the latest steps the engine keeps (0: none).
      freeze_gc: after start-up and warm-up the engine runs a full garbage collection and then
        `gc.freeze()`s every object alive (jax, the model, compiled steps): Python's full
        collections stop walking those ~200k objects, which cost a pause of 80-170 ms every few
        hundred steps at 256 running requests (0.3-0.5 ms a step on average, on the CPU of the
        host-time measurements in docs/architecture.md). It acts on the whole process: objects
        alive then are freed by reference counting only, so False for a process that builds and
        drops many engines whose garbage holds reference cycles.
      prefix_caching: "off", "align" or "all" (runtime/prefix_cache/). "align": prefill chunks
        end on state_block_size boundaries and the state at each such chunk end is cached;
        "all": the state at every boundary a prefill chunk or a decode step crosses is cached.
        Both cache full KV blocks. None: DEFAULT_PREFIX_CACHING where the config can cache
        (a state slot to spare, a state block shorter than max_model_len - 1), else "off"; a
        mode named explicitly that cannot work raises a ValueError saying why.
        Why "all" is the default (hit rates against "align" and what each costs):
        docs/architecture.md, "Prefix caching".
      state_block_size: tokens per cached recurrent state (a multiple of block_size and of the
        model's chunk size); None: their least common multiple, the finest possible. Per rank.
      max_cached_states: state slots the prefix cache may hold per rank (published and being
        written), apart from the running requests' slots; None: what an explicit num_slots
        leaves beside the requests' and lanes' slots + NULL, else max(max_num_seqs, 16) (a
        cached state per running request, at least 16).
      speculative: speculative decoding (`SpeculativeConfig`, or a dict of its fields); None
        decodes one token per request per step.
      async_scheduling: schedule and build step N + 1 while step N runs on the device, taking
        the tokens N samples from its output on the device; the host learns them one step late
        (docs/architecture.md, "Host cost"). `Engine.step()` then returns the requests that
        finished in the step before. Same tokens as without it. With `speculative`, only steps
        without drafts run so (`SpeculativeConfig.max_batch_size`): a step with drafts first
        retires the one in flight. Off by default here (stepping an engine by hand shows each
        step's own finishes); `LLM` turns it on unless speculation drafts in every step.
      decode_steps: N, the decode steps one device program runs while every scheduled request
        decodes, none waits, no step drafts and none samples with penalties (multi-step decode:
        each sampled token feeds the next step on the device, the host learns N steps' tokens
        at once; docs/architecture.md, "Multi-step decode"). 1 (the default): a program a step.
        Same tokens whatever N; a request that stops inside the N steps emits nothing after.
      one_sampler_program: greedy steps run the sampled sampler program (each greedy row takes
        its argmax inside it, the same token), so greedy and temperature-sampled requests share
        their compiled steps: half the programs to compile or load, at the Gumbel draw's cost
        (on the H100 at a 151936 vocabulary, 0.8-4.1% of the 0.87B decode step at B = 1-256:
        benchmarks/results). Off: a greedy step runs the greedy program.
      batch_invariant: products and norms' sums in an order fixed by static shapes
        (`jmamba.layers.invariance`): a request's bf16 outputs on the GPU do not depend on its batch
        or on speculative lanes; slower prefill. Off: XLA's, which round a row by the step's shape.
      kv_cache_dtype: the KV pools', "auto" (the model's dtype) or "fp8" (alias "fp8_e4m3"):
        e4m3, half a bf16 block's bytes, scale 1.0 (`jmamba.cache_dtypes`).
      state_dtype: the Mamba2 SSM and Gated DeltaNet recurrent states', "float32" or "bfloat16"
        (half a slot's recurrent bytes; the kernels still accumulate in fp32).
      kv_events_config: publish each rank's prefix cache events for KV-aware routers
        (`KVEventsConfig`, a dict of its fields or their JSON: vLLM's `--kv-events-config`;
        runtime/prefix_cache/events.py). None: no events. Events on need prefix caching.
    """

    max_num_seqs: int = 8
    max_num_batched_tokens: int | None = None
    max_model_len: int | None = None
    block_size: int = 16
    num_blocks: int | None = None
    num_slots: int | None = None
    decode_row_buckets: tuple[int, ...] | None = None
    prefill_token_buckets: tuple[int, ...] | None = None
    prefill_row_buckets: tuple[int, ...] | None = None
    bucket_table: str = "fine"
    data_parallel_size: int = 1
    tensor_parallel_size: int = 1
    gpu_memory_utilization: float | None = None
    seed: int = 0
    validate_inputs: bool = False
    step_records: int = 256
    freeze_gc: bool = True
    prefix_caching: str | None = None
    state_block_size: int | None = None
    max_cached_states: int | None = None
    speculative: SpeculativeConfig | dict[str, Any] | None = None
    async_scheduling: bool = False
    decode_steps: int = 1
    one_sampler_program: bool = False
    batch_invariant: bool = False
    kv_cache_dtype: str = "auto"
    state_dtype: str = "float32"
    kv_events_config: KVEventsConfig | dict[str, Any] | str | None = None

    def __post_init__(self) -> None:
        checks.integer("max_num_seqs", self.max_num_seqs, low=1)
        if self.max_model_len is not None:  # None: the checkpoint's, taken by `resolved`
            # One prompt token and one generated token at least: prompt + output <= max_model_len.
            checks.integer("max_model_len", self.max_model_len, low=2)
        checks.integer("block_size", self.block_size, low=1)
        checks.integer("seed", self.seed, low=0)
        checks.integer("data_parallel_size", self.data_parallel_size, low=1)
        checks.integer("tensor_parallel_size", self.tensor_parallel_size, low=1)
        checks.flag("validate_inputs", self.validate_inputs)
        checks.integer("step_records", self.step_records, low=0)
        checks.flag("freeze_gc", self.freeze_gc)
        if self.max_num_batched_tokens is not None:
            checks.integer("max_num_batched_tokens", self.max_num_batched_tokens, low=1)
        utilization = self.gpu_memory_utilization
        if utilization is not None and not (
            isinstance(utilization, float) and 0 < utilization <= 1
        ):
            raise ValueError(f"gpu_memory_utilization={utilization!r} must be a float in (0, 1]")
        if self.num_blocks is not None:
            checks.integer("num_blocks", self.num_blocks, low=2)
        if self.max_model_len is not None and not self.sizes_blocks_from_memory:
            self._check_num_blocks(self._default_blocks(self.max_model_len), self.max_model_len)
        checks.flag("async_scheduling", self.async_scheduling)
        checks.integer("decode_steps", self.decode_steps, low=1, high=MAX_DECODE_STEPS)
        checks.flag("one_sampler_program", self.one_sampler_program)
        checks.flag("batch_invariant", self.batch_invariant)
        CacheDtypes.of(self.kv_cache_dtype, self.state_dtype)  # a bad name raises here
        speculative = self.speculative_config  # a bad dict of its fields raises here
        if self.num_slots is not None:
            low = min_num_slots(self.max_num_seqs, speculative)
            checks.integer("num_slots", self.num_slots, low=low)
        check_prefix_caching(self)
        KVEventsConfig.of(self.kv_events_config)  # a bad dict or JSON raises here
        checks.choice("bucket_table", self.bucket_table, BUCKET_TABLES)
        self._tables(self.max_num_batched_tokens or 1)  # a given table that reaches too little

    @classmethod
    def of_config(cls, config: EngineConfig) -> EngineArgs:
        """The args that resolve to `config` (for its chunk size): every field as it holds it."""
        return cls(**{f.name: getattr(config, f.name) for f in dataclasses.fields(cls)})

    @property
    def speculative_config(self) -> SpeculativeConfig | None:
        """`speculative` as a `SpeculativeConfig` (a dict of its fields made into one)."""
        return SpeculativeConfig.of(self.speculative)

    @property
    def cache_dtypes(self) -> CacheDtypes:
        """The pools' dtypes these args name (`jmamba.cache_dtypes`; an alias resolved)."""
        return CacheDtypes.of(self.kv_cache_dtype, self.state_dtype)

    @property
    def sizes_blocks_from_memory(self) -> bool:
        """Whether `resolved` takes num_blocks from device memory (gpu_memory_utilization set,
        num_blocks not given)."""
        return self.gpu_memory_utilization is not None and self.num_blocks is None

    def for_model(self, model: ModelConfig, memory: PoolMemory | None = None) -> EngineConfig:
        """`resolved` for `model` (its chunk size and max_position_embeddings)."""
        limit = model.max_position_embeddings
        config = self.resolved(model.chunk_size, memory, max_position_embeddings=limit)
        return dataclasses.replace(config, vocab_size=model.vocab_size)

    def resolved(
        self,
        chunk_size: int,
        memory: PoolMemory | None = None,
        *,
        max_position_embeddings: int | None = None,
    ) -> EngineConfig:
        """The `EngineConfig` of these args for a model of `chunk_size` and (when known) the
        checkpoint's `max_position_embeddings`: every None derived (max_model_len, the prefix
        caching mode, state_block_size, max_cached_states, num_slots, the token budget and its
        buckets, num_blocks, from `memory` with gpu_memory_utilization).

        Raises ValueError when max_model_len exceeds the checkpoint's, when state_block_size is
        not a multiple of `chunk_size`, when an explicitly named prefix caching mode cannot work
        with these args (never a silent downgrade), or when num_blocks comes from memory and
        `memory` is None or too small.
        """
        length = resolve_max_model_len(self.max_model_len, max_position_embeddings)
        sbs = state_block_size(self, chunk_size)
        mode, cached = prefix_caching(self, sbs, length)
        events = kv_events(self, mode)
        speculative = self.speculative_config
        slots = self.num_slots
        if slots is None:
            slots = default_num_slots(self.max_num_seqs, speculative) + cached
            slots += chained_lane_slots(self.max_num_seqs, speculative, self.async_scheduling)
        alignment = sbs if mode == "align" else chunk_size  # where prefill chunks may end
        budget = self._token_budget(alignment, chunk_size)
        tables = self._tables(budget)
        config = EngineConfig(
            max_num_seqs=self.max_num_seqs,
            max_num_batched_tokens=budget,
            max_model_len=length,
            block_size=self.block_size,
            num_blocks=0,  # set below: from memory it depends on the other sizes
            num_slots=slots,
            decode_row_buckets=tables.decode_rows,
            prefill_token_buckets=tables.prefill_tokens,
            prefill_row_buckets=tables.prefill_rows,
            bucket_table=self.bucket_table,
            data_parallel_size=self.data_parallel_size,
            tensor_parallel_size=self.tensor_parallel_size,
            gpu_memory_utilization=self.gpu_memory_utilization,
            seed=self.seed,
            validate_inputs=self.validate_inputs,
            step_records=self.step_records,
            freeze_gc=self.freeze_gc,
            prefix_caching=mode,
            state_block_size=sbs,
            max_cached_states=cached,
            speculative=speculative,
            async_scheduling=self.async_scheduling,
            decode_steps=self.decode_steps,
            one_sampler_program=self.one_sampler_program,
            batch_invariant=self.batch_invariant,
            kv_cache_dtype=self.cache_dtypes.kv_cache,
            state_dtype=self.state_dtype,
            chunk_size=chunk_size,
            kv_events_config=events,
        )
        blocks = self._num_blocks(config, memory)
        self._check_num_blocks(blocks, length)
        return dataclasses.replace(config, num_blocks=blocks)

    def _token_budget(self, alignment: int, chunk_size: int) -> int:
        """max_num_batched_tokens, or its default; ValueError unless one full prefill chunk
        (ending on a multiple of `alignment`) fits beside a full decode batch."""
        if self.max_num_batched_tokens is None:
            return default_token_budget(alignment, self.max_num_seqs)
        needed = min_token_budget(alignment, self.max_num_seqs)
        if self.max_num_batched_tokens < needed:
            unit = (
                f"state_block_size={alignment} (prefix_caching='align')"
                if alignment != chunk_size
                else f"model's chunk_size={chunk_size}"
            )
            raise ValueError(
                f"max_num_batched_tokens={self.max_num_batched_tokens} must be >= chunk_size + "
                f"max_num_seqs - 1 = {needed}: one full prefill chunk of the {unit} must fit "
                "beside a full decode batch"
            )
        return self.max_num_batched_tokens

    def _default_blocks(self, length: int) -> int:
        """num_blocks, or without it the default pool for requests of `length` tokens."""
        if self.num_blocks is not None:
            return self.num_blocks
        defaulted = self.max_model_len is None  # the checkpoint's length, not the user's
        return default_num_blocks(self.max_num_seqs, length, self.block_size, defaulted=defaulted)

    def _num_blocks(self, config: EngineConfig, memory: PoolMemory | None) -> int:
        """num_blocks for `config` (every other size final): given, from memory, or the default."""
        utilization = self.gpu_memory_utilization
        if utilization is None or self.num_blocks is not None:  # not sized from memory
            return self._default_blocks(config.max_model_len)
        if memory is None:
            raise ValueError(
                f"gpu_memory_utilization={utilization} needs a device that reports its memory "
                "(the CPU does not): give num_blocks instead"
            )
        tokens, rows = config.largest_step
        return memory.num_blocks(
            utilization,
            config.num_slots,
            max(config.max_blocks_per_seq + 1, 2),
            step_tokens=tokens,
            logits_rows=rows,
        )

    def _check_num_blocks(self, blocks: int, length: int) -> None:
        needed = blocks_per_seq(length, self.block_size)
        if blocks - 1 < needed:
            raise ValueError(
                f"num_blocks={blocks} must be >= {needed + 1}: one request of "
                f"max_model_len={length} needs {needed} blocks of block_size={self.block_size} "
                "+ NULL"
            )

    def _tables(self, budget: int) -> BucketTables:
        """The bucket tables: those given, the others `bucket_table`'s for max_num_seqs and the
        token `budget`; ValueError unless each reaches its limit (the rows' max_num_seqs, the
        tokens' budget)."""
        default = default_tables(self.bucket_table, self.max_num_seqs, budget)
        tables = zip(
            ("decode_row_buckets", "prefill_token_buckets", "prefill_row_buckets"),
            default,
            (self.max_num_seqs, budget, self.max_num_seqs),
            strict=True,
        )
        return BucketTables(
            *(
                checks.sizes(name, table if given is None else given, reaching=limit)
                for name, table, limit in tables
                for given in [getattr(self, name)]
            )
        )
