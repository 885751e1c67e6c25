"""`DraftModelDrafter`: a smaller jmamba model over the target's vocabulary drafts greedily.

The draft model has its own caches (its own `ModelRunner`, on the same data-parallel mesh), and
per rank its own KV block pool and state-slot pool. Per request it keeps a `DraftSequence` whose
*committed* slot holds its state after the request's first `num_computed` tokens. Each engine
step, after the target's schedule is fixed and its ranks agreed on a bucket:

1. Catch-up pass (one step of the draft model, bucket = the target's with 1 + K lanes per decode
   row): each prefill chunk of the target is run on the draft model too (same tokens, same
   chunk: the draft model's prefills mirror the target's), and each decode row feeds the tokens
   the request gained since the draft model last ran (the target accepted a + 1 <= K + 1 of them
   last step), reading the committed slot and writing the state after each lane to a fresh slot
   (the kernels treat a lane without a write slot as padding); the last lane's slot becomes the
   committed one, the others go back. Its last lane's argmax is draft d_1.
2. Proposal passes j = 2..k (decode-only, one lane per row): each row with k >= j drafts feeds
   d_(j-1), reading the committed slot (j = 2) or its scratch slot (in place), writing the scratch
   slot. Its argmax is d_j. The committed state is never written, so the drafts roll back by slot
   choice: next step's catch-up reads the committed slot again. Scratch slots go back at the end.

The number of proposal passes is agreed by every process (`agree_max`), so a multi-host run
stays in lockstep; an idle rank runs all-padding steps, as in the target step.
"""

from __future__ import annotations

import dataclasses

import numpy as np
from flax import nnx

from runtime.buckets import Bucket, lane_width
from runtime.builder import StepBatch, build_dummy, build_step, with_mode
from runtime.config import EngineConfig
from runtime.distributed import agree_max
from runtime.model_runner import ModelRunner
from runtime.pools import NULL, Pool
from runtime.request import Request, RequestStatus, sampling_row
from runtime.sampling_inputs import SamplingMode
from runtime.sampling_params import SamplingParams
from runtime.scheduler import Schedule, ScheduledRequest
from runtime.speculative import default_num_slots


class DraftSequence:
    """The draft model's view of one request: what `build_step` reads of a `Request` (tokens,
    `state_slot` to read, `block_ids`, greedy sampling with the request's min_tokens masks), over
    the request's tokens followed by the drafts proposed so far in this step.

    Attributes:
      request: the target request.
      committed: the slot holding the draft model's state after `num_computed` tokens.
      scratch: the slot the proposal passes write (NULL outside them).
      state_slot: the slot the next pass reads (set by the drafter before each pass).
      block_ids: the draft model's KV blocks of this request.
      num_computed: tokens of the request whose effect is in the committed slot.
      drafts: this step's drafts d_1, d_2, ...
      first_output: the output index that lane 0 of the next pass samples (the builder masks the
        stop ids on lanes short of min_tokens, as the target does, so that the draft model
        proposes what the target can accept).
    """

    seed = 0
    masked_token_ids = ()  # a prefill row's token is never a draft

    def __init__(self, request: Request, slot: int) -> None:
        self.request = request
        params = request.sampling_params
        self.sampling_params = SamplingParams(max_tokens=params.max_tokens,
                                              min_tokens=params.min_tokens)  # fmt: skip
        self.stop_ids = request.stop_ids
        self.sampling_row = sampling_row(self.sampling_params, self.seed)
        self.committed = self.state_slot = slot
        self.scratch = self.first_output = 0
        self.block_ids: list[int] = []
        self.num_computed = 0
        self.drafts: list[int] = []
        self.draft_token_ids: list[int] = []  # none past `token_ids`, which covers the drafts
        self.num_preemptions = request.num_preemptions

    @property
    def output_token_ids(self) -> range:
        """Stands for the outputs before lane 0's (the builder reads only its length)."""
        return range(self.first_output)

    @property
    def num_sampled(self) -> int:
        return self.first_output

    @property
    def num_tokens(self) -> int:
        """The request's tokens and this step's drafts so far: every token a pass may feed."""
        return self.request.num_tokens + len(self.drafts)

    def token_at(self, index: int) -> int:
        num_tokens = self.request.num_tokens
        if index < num_tokens:
            return self.request.token_at(index)
        return self.drafts[index - num_tokens]

    def token_ids(self, start: int, stop: int) -> list[int]:
        n = self.request.num_tokens
        head = self.request.token_ids(start, min(stop, n))
        return head + self.drafts[max(start - n, 0) : max(stop - n, 0)]


class _RankDrafts:
    """One rank's draft-model pools and sequences."""

    def __init__(self, config: EngineConfig, uses_blocks: bool, uses_slots: bool) -> None:
        self.config = config
        self.uses_blocks, self.uses_slots = uses_blocks, uses_slots
        self.block_pool = Pool("draft KV block", config.num_blocks)
        self.slot_pool = Pool("draft state slot", config.num_slots)
        self.sequences: dict[Request, DraftSequence] = {}

    def sequence(self, item: ScheduledRequest) -> DraftSequence:
        """The sequence of a prefill item's request; a new one (a fresh slot) at its first
        chunk. The draft model has run every earlier chunk of the request."""
        seq = self.sequences.get(item.request)
        if seq is None:
            slot = self.allocate(1)[0]
            seq = self.sequences[item.request] = DraftSequence(item.request, slot)
        if seq.num_computed != item.start:
            raise RuntimeError(f"draft model at token {seq.num_computed}, chunk at {item.start}")
        return seq

    def allocate(self, n: int) -> list[int]:
        """n fresh slots (NULL for a model without recurrent state; the pool is sized for
        1 + K lane slots per decode row beside each request's committed slot)."""
        return self.slot_pool.allocate(n) if self.uses_slots else [0] * n

    def free(self, slots: list[int]) -> None:
        if self.uses_slots:
            self.slot_pool.free(slots)

    def reserve_blocks(self, seq: DraftSequence, num_tokens: int) -> None:
        """KV blocks for positions [0, num_tokens) (the pool is sized never to run short)."""
        if self.uses_blocks:
            total = -(-num_tokens // self.config.block_size)
            if total > len(seq.block_ids):
                seq.block_ids += self.block_pool.allocate(total - len(seq.block_ids))

    def release_done(self) -> None:
        """Drop the sequences of requests that finished, were aborted or were preempted."""
        for request, seq in list(self.sequences.items()):
            running = request.status is RequestStatus.RUNNING
            if running and request.num_preemptions == seq.num_preemptions:
                continue
            self.block_pool.free(seq.block_ids)
            self.free([seq.committed])
            del self.sequences[request]

    def catch_up(self, schedule: Schedule) -> Schedule:
        """The draft model's first pass of the step (module docstring, 1)."""
        decodes, prefills = [], []
        for item in schedule.decodes:
            seq = self.sequences[item.request]
            n = item.request.num_tokens
            self.reserve_blocks(seq, n + max(item.num_tokens - 2, 0))  # + the proposal passes
            seq.state_slot, seq.drafts = seq.committed, []
            lanes = n - seq.num_computed
            seq.first_output = len(item.request.output_token_ids) - (lanes - 1)
            slots = tuple(self.allocate(lanes))
            decodes.append(
                ScheduledRequest(
                    seq, seq.num_computed, lanes, read_slot=seq.state_slot, lane_slots=slots
                )
            )
        for item in schedule.prefills:
            seq = self.sequence(item)
            self.reserve_blocks(seq, item.start + item.num_tokens)
            seq.state_slot = seq.committed
            read = seq.committed if item.start else NULL  # a first chunk starts from zeros
            prefills.append(
                ScheduledRequest(
                    seq, item.start, item.num_tokens, read_slot=read, write_slot=seq.committed
                )
            )
        return Schedule(decodes, prefills, [])

    def after_catch_up(self, schedule: Schedule, tokens: np.ndarray) -> None:
        """Commit the catch-up pass; each decode row's token is its first draft."""
        for item, token in zip(schedule.decodes, tokens[: len(schedule.decodes)], strict=True):
            seq = item.request
            self.free([seq.committed, *item.lane_slots[:-1]])
            seq.committed = seq.state_slot = item.lane_slots[-1]
            seq.num_computed += item.num_tokens
            seq.drafts = [int(token)]
        for item in schedule.prefills:
            item.request.num_computed += item.num_tokens

    def proposal(self, schedule: Schedule, j: int) -> Schedule:
        """Pass j >= 2: rows that want a j-th draft feed their (j-1)-th (module docstring, 2)."""
        rows = []
        for item in schedule.decodes:
            if item.num_tokens - 1 < j:
                continue
            seq = self.sequences[item.request]
            if j == 2:
                seq.scratch = self.allocate(1)[0]
            seq.state_slot = seq.committed if j == 2 else seq.scratch
            seq.first_output = len(item.request.output_token_ids) + j - 1
            rows.append(
                ScheduledRequest(
                    seq,
                    seq.num_computed + j - 2,
                    1,
                    read_slot=seq.state_slot,
                    lane_slots=(seq.scratch,),
                )
            )
        return Schedule(rows, [], [])

    def end_proposals(self, schedule: Schedule) -> list[int]:
        """Give back the scratch slots; return the decode rows' drafts, in order."""
        drafts = []
        for item in schedule.decodes:
            seq = self.sequences[item.request]
            if item.num_tokens > 2:  # it ran proposal passes
                self.free([seq.scratch])
            seq.scratch, seq.state_slot = 0, seq.committed
            drafts.append(seq.drafts[: item.num_tokens - 1])
        return drafts


class DraftModelDrafter:
    """Proposes drafts with a draft model (see the module docstring)."""

    def __init__(
        self,
        model: nnx.Module,
        target_config: EngineConfig,
        target_chunk_size: int,
        num_ranks: int,
        *,
        runner: ModelRunner | None = None,
    ) -> None:
        self.k = target_config.speculative.num_speculative_tokens
        self.config = draft_engine_config(target_config)
        if runner is not None:  # shared (tests, notebooks): its pools, if large enough
            _check_shared_runner(runner.config, self.config)
            self.config = runner.config
        self.runner = runner or ModelRunner(model, self.config)
        self.model_config = model.config
        chunk = model.config.chunk_size
        # Prefill chunks end where the target's do: the draft model's own invariance check
        # holds only where its chunk size divides the target's (drafts stay valid either way).
        self.chunk_size = chunk if target_chunk_size % chunk == 0 else None
        self.ranks = [
            _RankDrafts(self.config, model.config.has_attention, model.config.has_recurrent_state)
            for _ in range(num_ranks)
        ]

    def num_wanted(self, request: Request) -> int:
        """The draft model can always propose K drafts."""
        return self.k

    def propose(self, schedules: list[Schedule], bucket: Bucket) -> None:
        """Run the catch-up pass and the proposal passes; give each decode row its drafts."""
        self.release_done()
        passes = [rank.catch_up(s) for rank, s in zip(self.ranks, schedules, strict=True)]
        rows = bucket.num_decode_rows
        first = Bucket(rows, lane_width(rows, self.k + 1), bucket.num_prefill_tokens,
                       bucket.num_prefill_rows)  # fmt: skip
        for rank, draft, tokens in zip(self.ranks, passes, self._run(first, passes), strict=True):
            rank.after_catch_up(draft, tokens)
        local = max((item.num_tokens - 1 for s in schedules for item in s.decodes), default=0)
        num_drafts = int(agree_max(np.array([local], np.int32))[0])
        for j in range(2, num_drafts + 1):
            passes = [rank.proposal(s, j) for rank, s in zip(self.ranks, schedules, strict=True)]
            step = Bucket(bucket.num_decode_rows, 1, 0, 0)
            for draft, tokens in zip(passes, self._run(step, passes), strict=True):
                for item, token in zip(draft.decodes, tokens, strict=True):
                    item.request.drafts.append(int(token))
        for rank, schedule in zip(self.ranks, schedules, strict=True):
            for item, drafts in zip(schedule.decodes, rank.end_proposals(schedule), strict=True):
                item.request.draft_token_ids = drafts

    def release_done(self) -> None:
        for rank in self.ranks:
            rank.release_done()

    def warmup(self) -> None:
        """Compile the draft model's decode-only passes."""
        self.runner.warmup([Bucket(rows, width, 0, 0) for rows in self.config.decode_row_buckets
                            for width in (self.k + 1, 1)])  # fmt: skip

    def _run(self, bucket: Bucket, schedules: list[Schedule]) -> list[np.ndarray]:
        """One draft-model step; per rank, each scheduled row's greedy token (in item order).
        The ranks of every process agree on the sampler mode (its min_tokens mask width)."""
        batches = [self._build(schedule, bucket) for schedule in schedules]
        needs = np.max([batch.mode.as_array() for batch in batches], axis=0)
        mode = SamplingMode.from_array(agree_max(needs))
        batches = [with_mode(batch, mode) for batch in batches]
        results = self.runner.run(bucket, batches)
        return [r[0][b.sample_rows] for r, b in zip(results, batches, strict=True)]

    def _build(self, schedule: Schedule, bucket: Bucket) -> StepBatch:
        max_blocks = self.config.max_blocks_per_seq
        if schedule.is_empty:
            return build_dummy(bucket, max_blocks=max_blocks)
        batch = build_step(schedule, bucket, block_size=self.config.block_size,
                           max_blocks=max_blocks)  # fmt: skip
        if self.config.validate_inputs:
            batch.inputs.validate(block_size=self.config.block_size, chunk_size=self.chunk_size,
                                  num_blocks=self.config.num_blocks,
                                  num_slots=self.config.num_slots,
                                  vocab_size=self.model_config.vocab_size)  # fmt: skip
        return batch


def draft_engine_config(config: EngineConfig) -> EngineConfig:
    """The draft model's pools and buckets: the target's buckets, max_model_len and block size;
    a KV pool for every request at max_model_len; per request its committed slot and 1 + K lane
    slots for the catch-up pass (the target's default count; as many as the target's if more);
    no prefix cache (the draft model catches up from its own committed state)."""
    slots = max(config.num_slots, default_num_slots(config.max_num_seqs, config.speculative))
    return dataclasses.replace(config, speculative=None, num_blocks=None, num_slots=slots,
                               prefix_caching="off", state_block_size=None,
                               max_cached_states=None)  # fmt: skip


def _check_shared_runner(shared: EngineConfig, needed: EngineConfig) -> None:
    for name in ("block_size", "max_model_len", "decode_row_buckets", "prefill_token_buckets",
                 "prefill_row_buckets", "data_parallel_size"):  # fmt: skip
        theirs, ours = getattr(shared, name), getattr(needed, name)
        if theirs != ours:
            raise ValueError(f"draft runner {name}={theirs} differs from this engine's {ours}")
    for name in ("num_blocks", "num_slots"):
        theirs, ours = getattr(shared, name), getattr(needed, name)
        if theirs < ours:
            raise ValueError(f"draft runner {name}={theirs} is below this engine's {ours}")


def check_draft_model(draft: nnx.Module, target: nnx.Module) -> None:
    """ValueError unless `draft` is a jmamba model over the target's vocabulary."""
    config = getattr(draft, "config", None)
    if config is None or not hasattr(config, "vocab_size"):
        raise ValueError(f"draft_model={type(draft).__name__} is not a jmamba model")
    if config.vocab_size != target.config.vocab_size:
        raise ValueError(
            f"draft model vocab_size={config.vocab_size} differs from the target's "
            f"{target.config.vocab_size}: drafts must be target token ids"
        )
