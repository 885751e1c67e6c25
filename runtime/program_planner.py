"""`ProgramPlanner`: the steps of the engine's next device program, planned on the host.

A program is one step, or N decode steps (multi-step decode, `EngineArgs.decode_steps`): every
rank schedules, the ranks agree on one bucket and sampler mode, the drafter proposes, and each
rank's batch is built fresh for that bucket (an idle rank's all padding). For N steps, each step
after the first is scheduled once the one before has moved its rows on (`advance`), before any
of their tokens are known, exactly as asynchronous scheduling schedules step N + 1 while N runs:
its token lanes take their tokens from the step before on the device.
"""

from __future__ import annotations

from jmamba.config import ModelConfig
from runtime.core.buckets import Bucket, BucketPolicy
from runtime.core.builder import build_rank
from runtime.core.config import EngineConfig
from runtime.core.sampling_inputs import SamplingMode
from runtime.core.schedule import Schedule
from runtime.core.scheduler import Scheduler, no_drafts
from runtime.core.step_batch import StepBatch
from runtime.device.distributed import agree_max, agree_max_int
from runtime.launched_step import LaunchedStep
from runtime.observe.step_record import ScheduleRecord
from runtime.speculative.drafter import Drafter


def idle() -> Schedule:
    """The schedule of a rank's step that runs no row (an all-padding step)."""
    return Schedule([], [], [])


class ProgramPlanner:
    """Plans each program of an engine's ranks (`plan`) and moves a planned step's rows on
    (`advance`). The drafter is the engine's, passed to each call (tests replace it)."""

    def __init__(
        self,
        config: EngineConfig,
        model_config: ModelConfig,
        schedulers: list[Scheduler],
        buckets: BucketPolicy,
        num_carried: int,
        keeps_records: bool,
    ) -> None:
        """`buckets`: how a schedule maps to its bucket; `num_carried`: the tokens a carrying
        step may take from the one before (the runner's, for the checks of `validate_inputs`);
        `keeps_records`: snapshot each schedule."""
        self.config, self.model_config = config, model_config
        self.schedulers = schedulers
        self.buckets = buckets
        self.num_carried = num_carried
        self.keeps_records = keeps_records
        self.num_planned = 0  # steps planned so far: the next step's index

    def plan(self, drafter: Drafter, drafting: bool) -> list[LaunchedStep]:
        """The next program's steps (empty: no rank of any process has work): one, or
        `num_steps` decode steps, every step but the last already moved on."""
        num_drafts = drafter.num_wanted if drafting else no_drafts
        schedules = [s.schedule(num_drafts) for s in self.schedulers]
        agreed = self._agree(schedules)
        if agreed is None:
            return []
        bucket, mode = agreed
        steps = [self._planned(drafter, bucket, mode, schedules, drafting)]
        for _ in range(1, self.num_steps(bucket, mode, drafting)):
            self.advance(drafter, steps[-1])
            schedules = [s.schedule() if s.decodes_only else idle() for s in self.schedulers]
            steps.append(self._planned(drafter, bucket, mode, schedules, False))
        return steps

    def num_steps(self, bucket: Bucket, mode: SamplingMode, drafting: bool) -> int:
        """N, the steps the program runs: `decode_steps` when its first step holds decode rows
        alone and nothing else is left to schedule on any rank (nothing waits, nothing
        prefills), it drafts nothing, no row samples with penalties (their counts would miss
        the tokens still on the device) and no running request follows a grammar (its masks
        need every token on the host); else 1. Later steps schedule the ranks' decodes; a
        rank that preempts one (so something waits) runs all-padding steps for the rest."""
        n = self.config.decode_steps
        if n == 1 or drafting or not bucket.is_decode_only or mode.penalty_width:
            return 1
        schedulers = self.schedulers
        busy = not all(s.decodes_only for s in schedulers)
        elsewhere = agree_max_int(busy or any(s.follows_grammar for s in schedulers))
        return 1 if elsewhere else n

    def advance(self, drafter: Drafter, step: LaunchedStep) -> None:
        """The step's rows move on (`Scheduler.advance`): the next step can be scheduled before
        its tokens are known."""
        parts = zip(self.schedulers, step.schedules, step.batches, strict=True)
        for scheduler, schedule, batch in parts:
            moved = scheduler.advance(schedule, batch.sample_rows)
            drafter.dispatched(schedule, step.bucket, moved, step.drafted)

    def _planned(
        self,
        drafter: Drafter,
        bucket: Bucket,
        mode: SamplingMode,
        schedules: list[Schedule],
        drafting: bool,
    ) -> LaunchedStep:
        """One step of a program: each rank's schedule (with its drafts when `drafting`) and
        batch, numbered."""
        snapshots = [ScheduleRecord.of(s) for s in schedules] if self.keeps_records else []
        schedules = drafter.propose(schedules, bucket) if drafting else schedules
        batches = [
            self._build(scheduler, schedule, bucket).with_mode(mode)
            for scheduler, schedule in zip(self.schedulers, schedules, strict=True)
        ]
        index, self.num_planned = self.num_planned, self.num_planned + 1
        return LaunchedStep(index, bucket, mode, schedules, batches, snapshots, drafting)

    def _agree(self, schedules: list[Schedule]) -> tuple[Bucket, SamplingMode] | None:
        """Elementwise max of the ranks' buckets and sampler modes, over every process; None if
        no rank of any process has work (then no step runs anywhere)."""
        agreed = agree_max(self.buckets.needs(schedules))
        return self.buckets.agreed(agreed)

    def _build(self, scheduler: Scheduler, schedule: Schedule, bucket: Bucket) -> StepBatch:
        """A rank's batch for `bucket`, checked against the invariants with `validate_inputs`."""
        config = self.config
        batch = build_rank(schedule, bucket, config, state_block_size=config.boundary_block_size)
        if config.validate_inputs:
            batch.validate(
                config,
                chunk_size=self.model_config.chunk_size,
                vocab_size=self.model_config.vocab_size,
                published_slots=scheduler.slots.published_slots,
                published_blocks=scheduler.slots.published_blocks,
                num_carried=self.num_carried,
            )
        return batch
