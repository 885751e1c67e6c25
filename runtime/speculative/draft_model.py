"""`DraftModelDrafter`: a smaller jmamba model over the target's vocabulary drafts greedily.

The draft model has its own caches (its own `ModelRunner`, on the same data-parallel mesh), and
per rank its own KV block pool and state-slot pool (`RankDrafts`, runtime/speculative/
draft_sequences.py). Per request it keeps a `DraftSequence` whose *committed* slot holds its
state after the request's first `num_computed` tokens. Each engine step, after the target's
schedule is fixed and its ranks agreed on a bucket:

0. Fill passes (prefill-only steps of the draft model, none in most steps): a prefill chunk of the
   target that starts past its sequence's tokens (the target started the request after a cached
   prefix, or returned to one after a preemption; the draft model keeps no prefix cache of its
   own) first has the tokens in between prefilled on the draft model, within the token budget
   per pass, so the draft model's state follows the target's hits.

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

from jmamba.model import HybridLM
from runtime.core.buckets import Bucket, lane_width, round_up
from runtime.core.builder import build_rank
from runtime.core.config import POOL_SIZE_FIELDS, STEP_SHAPE_FIELDS, EngineConfig
from runtime.core.engine_args import EngineArgs
from runtime.core.request import Request
from runtime.core.sampling_inputs import SamplingMode
from runtime.core.sampling_params import SamplingParams
from runtime.core.schedule import Schedule
from runtime.core.speculative_config import default_num_slots
from runtime.core.step_batch import StepBatch
from runtime.device.distributed import agree_max, agree_max_int
from runtime.device.memory import resolve_config
from runtime.device.model_runner import ModelRunner
from runtime.speculative.draft_sequences import Drafts, RankDrafts
from runtime.speculative.verify import check_verifiable


class DraftModelDrafter:
    """Proposes drafts with a draft model (see the module docstring)."""

    def __init__(
        self,
        model: HybridLM,
        target_config: EngineConfig,
        num_ranks: int,
        *,
        runner: ModelRunner | None = None,
    ) -> None:
        self.k = target_config.num_speculative_tokens
        self.config = resolve_config(model, draft_engine_args(target_config))
        if runner is not None:  # shared (tests, notebooks): its pools, if large enough
            _check_shared_runner(runner.config, self.config)
            self.config = runner.config
        self.runner = runner or ModelRunner(model, self.config)
        self.model_config = model.config
        chunk = model.config.chunk_size
        # Prefill chunks end where the target's do: the draft model's own invariance check
        # holds only where its chunk size divides the target's (drafts stay valid either way),
        # and only then do fill passes need to stop on multiples of it.
        self.chunk_size = chunk if target_config.chunk_size % chunk == 0 else None
        self.ranks = [
            RankDrafts(self.config, model.config.has_attention, model.config.has_recurrent_state)
            for _ in range(num_ranks)
        ]

    def check(self, params: SamplingParams) -> None:
        check_verifiable(params)

    def num_wanted(self, request: Request) -> int:
        """The draft model can always propose K drafts."""
        return self.k

    def propose(self, schedules: list[Schedule], bucket: Bucket) -> list[Schedule]:
        """Run the fill, catch-up and proposal passes; give each row with lanes its drafts."""
        self.release_done()
        self._fill(schedules)
        passes = [rank.catch_up(s) for rank, s in zip(self.ranks, schedules, strict=True)]
        rows = bucket.num_decode_rows
        first = Bucket(
            rows, lane_width(rows, self.k + 1), bucket.num_prefill_tokens, bucket.num_prefill_rows
        )
        for rank, draft, tokens in zip(self.ranks, passes, self._run(first, passes), strict=True):
            rank.after_catch_up(draft, tokens)
        local = max((item.num_tokens - 1 for s in schedules for item in s.decodes), default=0)
        num_drafts = agree_max_int(local)
        for j in range(2, num_drafts + 1):
            passes = [rank.proposal(s, j) for rank, s in zip(self.ranks, schedules, strict=True)]
            step = Bucket(bucket.num_decode_rows, 1, 0, 0)
            for draft, tokens in zip(passes, self._run(step, passes), strict=True):
                for item, token in zip(draft.decodes, tokens, strict=True):
                    item.request.drafts.append(int(token))
        return [
            _with_proposals(schedule, rank.end_proposals(schedule))
            for rank, schedule in zip(self.ranks, schedules, strict=True)
        ]

    def dispatched(
        self, schedule: Schedule, bucket: Bucket, moved: list[bool], drafted: bool
    ) -> None:
        """Its drafts are proposed on the host, from the tokens the last retired step gave."""

    def observe(self, schedule: Schedule, bucket: Bucket, drafts: np.ndarray | None) -> None:
        """Learns nothing from the target's step."""

    def release_done(self) -> None:
        for rank in self.ranks:
            rank.release_done()

    @property
    def total_compile_seconds(self) -> float:
        return self.runner.total_compile_seconds

    def warmup(self) -> None:
        """Compile the draft model's decode-only passes."""
        self.runner.warmup(
            [
                Bucket(rows, width, 0, 0)
                for rows in self.config.decode_row_buckets
                for width in (self.k + 1, 1)
            ]
        )

    def _fill(self, schedules: list[Schedule]) -> None:
        """Fill passes until every prefill chunk starts where its sequence is (module docstring,
        0); every process runs as many as the one that needs the most."""
        config = self.config
        budget, max_rows = config.prefill_token_buckets[-1], config.prefill_row_buckets[-1]
        while True:
            passes = [
                rank.fill_pass(s, budget, max_rows, self.chunk_size or 1)
                for rank, s in zip(self.ranks, schedules, strict=True)
            ]
            local = [
                max(p.num_prefill_tokens for p in passes),
                max(len(p.prefills) for p in passes),
            ]
            tokens, rows = agree_max(np.array(local, np.int32)).tolist()
            if rows == 0:
                return
            bucket = Bucket(
                0,
                1,
                round_up(config.prefill_token_buckets, tokens),
                round_up(config.prefill_row_buckets, rows),
            )
            self._run(bucket, passes)
            for draft in passes:
                RankDrafts.after_prefills(draft)

    def _run(self, bucket: Bucket, schedules: list[Drafts]) -> list[list[int]]:
        """One draft-model step; per rank, each scheduled row's greedy token (in item order).
        The ranks of every process agree on the sampler mode (its min_tokens mask width)."""
        batches = [self._build(schedule, bucket) for schedule in schedules]
        needs = np.max([batch.mode.as_array() for batch in batches], axis=0)
        mode = SamplingMode.from_array(agree_max(needs))
        batches = [batch.with_mode(mode) for batch in batches]
        tokens = self.runner.run(bucket, batches).tokens
        return [t[b.sample_rows].tolist() for t, b in zip(tokens, batches, strict=True)]

    def _build(self, schedule: Drafts, bucket: Bucket) -> StepBatch:
        config = self.config
        batch = build_rank(schedule, bucket, config)
        if config.validate_inputs and not schedule.is_empty:
            batch.validate(
                config, chunk_size=self.chunk_size, vocab_size=self.model_config.vocab_size
            )
        return batch


def _with_proposals(schedule: Schedule, drafts: list[tuple[int, ...]]) -> Schedule:
    """`schedule` with each decode row given its drafts (rows without lanes get none)."""
    decodes = [
        item._replace(draft_token_ids=row_drafts) if item.lane_slots else item
        for item, row_drafts in zip(schedule.decodes, drafts, strict=True)
    ]
    return dataclasses.replace(schedule, decodes=decodes)


def draft_engine_args(config: EngineConfig) -> EngineArgs:
    """The draft model's args, from the target's config: the target's buckets, max_model_len and
    block size; a KV pool for every request at max_model_len; per request its committed slot and
    1 + K lane slots for the catch-up pass (the target's default count; as many as the target's
    if more); no prefix cache (the fill passes catch a sequence up after the target's hits)."""
    slots = max(config.num_slots, default_num_slots(config.max_num_seqs, config.speculative))
    return dataclasses.replace(
        EngineArgs.of_config(config),
        speculative=None,
        num_blocks=None,
        num_slots=slots,
        prefix_caching="off",
        state_block_size=None,
        max_cached_states=None,
    )


def _check_shared_runner(shared: EngineConfig, needed: EngineConfig) -> None:
    """ValueError unless a shared draft runner has the draft passes' step shapes and pools at
    least as large as this engine's."""
    for name in STEP_SHAPE_FIELDS:
        theirs, ours = getattr(shared, name), getattr(needed, name)
        if theirs != ours:
            raise ValueError(f"draft runner {name}={theirs} differs from this engine's {ours}")
    for name in POOL_SIZE_FIELDS:
        theirs, ours = getattr(shared, name), getattr(needed, name)
        if theirs < ours:
            raise ValueError(f"draft runner {name}={theirs} is below this engine's {ours}")


def check_draft_model(draft: object, target: HybridLM) -> HybridLM:
    """`draft` if it is a jmamba model (`HybridLM`) over the target's vocabulary; else
    ValueError."""
    if not isinstance(draft, HybridLM):
        raise ValueError(f"draft_model={type(draft).__name__} is not a jmamba model")
    vocab_size = draft.config.vocab_size
    if vocab_size != target.config.vocab_size:
        raise ValueError(
            f"draft model vocab_size={vocab_size} differs from the target's "
            f"{target.config.vocab_size}: drafts must be target token ids"
        )
    return draft
