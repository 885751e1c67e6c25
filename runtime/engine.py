"""`Engine`: wires schedulers, router, drafter, builder and model runner into one step loop.

`step()` = plan the next program (`runtime.program_planner`: schedule, agree on a bucket, draft,
build fresh padded inputs per rank; several decode steps while every request decodes) -> run it
-> retire its steps per rank (verify drafts, append tokens, publish to the prefix cache).
Requests come in through `add_request` (checked there, so a bad request never reaches a step and
the other requests keep being served) and leave through `step()`'s return value or `abort`;
`stream()` yields what each step added to each request instead. Prefix caching and speculative
decoding sit behind seams that are always present (each rank's slot planner, the drafter), so
the loop has no feature branches. docs/architecture.md describes the design.
"""

from __future__ import annotations

import collections
import gc
from collections.abc import Iterator, Sequence
from typing import Any, Literal

from jmamba.model import HybridLM
from runtime.core import checks
from runtime.core.buckets import Bucket, BucketPolicy
from runtime.core.config import COMPILE_WORKERS
from runtime.core.engine_args import EngineArgs
from runtime.core.request import FinishReason, Request
from runtime.core.request_table import RequestTable
from runtime.core.sampling_params import SamplingParams
from runtime.core.schedule import Schedule
from runtime.core.scheduler import Scheduler
from runtime.core.step_batch import StepBatch
from runtime.device.distributed import agree_max_int
from runtime.device.memory import pool_memory
from runtime.device.model_runner import ModelRunner
from runtime.device.mtp_drafts import served_model
from runtime.device.placement import ParamSource, place_params
from runtime.device.step_result import StepResult
from runtime.device.warmup import warm_up
from runtime.launched_step import LaunchedProgram, LaunchedStep
from runtime.observe.describe import describe_engine
from runtime.observe.snapshot import EngineSnapshot
from runtime.observe.step_record import StepRecord
from runtime.observe.step_stats import StepStats, StepTimer
from runtime.observe.view import EngineView
from runtime.outputs.processor import OutputProcessor, Sampled, sampled_items, stream_deltas
from runtime.outputs.request_output import RequestOutput, StreamDelta
from runtime.prefix_cache import slot_planner
from runtime.program_planner import ProgramPlanner
from runtime.router import LeastOutstandingWork, Router
from runtime.speculative.drafter import make_drafter
from runtime.speculative.gate import draft_gate
from runtime.speculative.verify import verified_tokens


class Engine:
    """Serve requests on a data-parallel mesh of one or more devices: `add_request`, `step`,
    `abort`.

    Each rank driven by this process has its own `Scheduler` (and pools, and slot planner); a
    `Router` places each new request on one of them. Every step every rank runs, in one bucket:
    the elementwise max of what the ranks' schedules need; a rank with nothing scheduled runs an
    all-padding step.

    With a `tokenizer` (a `tokenizers.Tokenizer`) outputs carry text and requests may use stop
    strings. For looking inside: `records` (the latest steps as `StepRecord`s), `request(id)`,
    `inspect` (schedulers, last schedule and batch, block and slot owners), `stats`,
    `pool_memory` (one device's bytes that sized the KV pool, when `gpu_memory_utilization` did).
    """

    def __init__(
        self,
        model: HybridLM,
        args: EngineArgs | None = None,
        *,
        keep_logits: bool = False,
        params: ParamSource = place_params,
        runner: ModelRunner | None = None,
        router: Router | None = None,
        tokenizer: Any = None,
        draft_model: HybridLM | None = None,
        draft_runner: ModelRunner | None = None,
    ) -> None:
        """Resolve `args` for `model` once (`config`), then build pools, schedulers and the runner
        (`params` places the parameters: `runtime.device.placement`); `runner` instead reuses the
        compiled steps and caches of another engine with the same pool sizes and bucket tables
        (tests, notebooks). With `args.speculative` of method "draft_model", `draft_model` is the
        draft model (default: loaded from its `draft_model` field) and `draft_runner` may share
        its compiled steps and caches likewise."""
        args = args or EngineArgs()
        model = served_model(model, args.speculative_config)  # its MTP head only if it drafts
        self.model_config = model.config
        self.pool_memory = pool_memory(model, args)  # None unless blocks are sized from memory
        self.config = args.for_model(self.model_config, self.pool_memory)
        self.runner = runner or ModelRunner(
            model, self.config, keep_logits=keep_logits, params=params
        )
        self.config.check_same_shapes(self.runner.config, "the shared runner")
        self.ranks = self.runner.local_ranks
        self.schedulers = [self._scheduler(rank) for rank in self.ranks]
        self.router = router or LeastOutstandingWork()
        self.buckets = BucketPolicy(self.config)
        self.drafter = make_drafter(self.config, model, len(self.ranks), draft_model, draft_runner)
        self.gate = draft_gate(self.config)
        self.stats = StepStats.of_ranks([s.slots.stats for s in self.schedulers])
        self.planner = ProgramPlanner(
            self.config,
            self.model_config,
            self.schedulers,
            self.buckets,
            self.runner.num_carried,
            keeps_records=self.config.step_records > 0,
        )
        self.last_bucket: Bucket | None = None
        self.last_schedules: list[Schedule] = []
        self.last_batches: list[StepBatch] = []
        self.last_program: LaunchedProgram | None = None  # the last dispatched (tests, views)
        self.last_result: StepResult | None = None  # the last retired step's (tests, views)
        self.requests = RequestTable.of(self.config, self.model_config)
        self._timer = StepTimer([self.runner, self.drafter])
        self._num_retired = 0  # decode tokens the current step retired (`gate.observe`)
        self._in_flight: LaunchedProgram | None = None  # asynchronous: dispatched, not retired
        self.tokenizer = tokenizer
        self.records: collections.deque[StepRecord] = collections.deque(
            maxlen=self.config.step_records
        )
        self.last_deltas: list[StreamDelta] = []  # filled while `stream()` drives the engine
        self._streaming = False
        self.outputs = OutputProcessor(tokenizer)
        self._freeze_gc()

    def _scheduler(self, rank: int) -> Scheduler:
        """A rank's scheduler, with the slot planner its config asks for."""
        model = self.model_config
        slots = slot_planner(
            self.config, rank, uses_blocks=model.has_attention, uses_slots=model.has_recurrent_state
        )
        return Scheduler(self.config, slots)

    # --------------------------------------------------------------------------------- requests

    def add_request(
        self,
        prompt_token_ids: Sequence[int],
        sampling_params: SamplingParams | None = None,
        request_id: str | int | None = None,
    ) -> str:
        """Queue a request on the rank the router picks; returns its id (a str: an int id means
        `str(request_id)`).

        Raises ValueError, and queues nothing, on bad input: the other requests keep being served.
        """
        prompt, params = self.check_request(prompt_token_ids, sampling_params)
        if params.stop and self.tokenizer is None:
            raise ValueError(f"stop={params.stop!r}: stop strings need a tokenizer")
        self.drafter.check(params)
        request = self.requests.new(prompt, params, request_id)
        rank = self.router.place(request, self.schedulers)
        self.requests.add(request, rank)
        self.outputs.add(request)
        self.schedulers[rank].add(request)
        return request.request_id

    def check_request(
        self, prompt_token_ids: Sequence[int], sampling_params: SamplingParams | None = None
    ) -> tuple[list[int], SamplingParams]:
        """(prompt as a list of ints, sampling params) for this engine's model; ValueError
        naming what is wrong."""
        return self.requests.check(prompt_token_ids, sampling_params)

    def abort(self, request_id: str | int) -> RequestOutput | None:
        """Stop a request now and free its blocks and slot; None if it is unknown or finished."""
        request_id = checks.request_id(request_id)
        rank = self.requests.local_rank(request_id)
        request = None if rank is None else self.schedulers[rank].abort(request_id)
        if request is None:
            return None
        self.drafter.release_done()
        return self._release(request)

    def request(self, request_id: str | int) -> Request:
        """The live (waiting or running) request with this id."""
        return self.requests.get(request_id)

    def rank_of(self, request_id: str | int) -> int:
        """The global data-parallel rank serving a live request."""
        return self.ranks[self.requests.rank_of(request_id)]

    @property
    def has_unfinished(self) -> bool:
        """Whether a rank of this process holds a waiting or running request, or a dispatched
        step whose tokens have not been retired (asynchronous scheduling)."""
        return self._in_flight is not None or any(s.has_unfinished for s in self.schedulers)

    def any_unfinished(self) -> bool:
        """Whether any process holds unfinished requests (a collective in a multi-host run: every
        process calls it at the same point of its loop)."""
        return bool(agree_max_int(self.has_unfinished))

    # --------------------------------------------------------------------------------- the step

    def step(self) -> list[RequestOutput]:
        """Run one program on every rank (one step, or `decode_steps` decode steps); returns the
        requests that finished in it (with `async_scheduling`: in the program before; a step with
        drafts proposed on the host first retires that one). In a
        multi-host run every process calls `step()` in lockstep (it agrees on drafting, the
        bucket and the sampler mode)."""
        self._timer.start()
        self._num_retired = 0
        self.last_deltas = []  # a step that retires nothing streams nothing
        drafting = self._drafts_now()
        synchronous = drafting and not self.buckets.drafting_carries
        outputs = self._drain() if synchronous else []  # host drafts need every row's last token
        launched = self._launch(drafting)
        last = None if launched is None else launched.steps[-1]  # the others moved on already
        if self.config.async_scheduling and not synchronous:  # retire N - 1 while N runs
            retiring, self._in_flight = self._in_flight, launched
            retired = [] if retiring is None else self._retire(retiring)
            self._advance(last)
        else:  # N moves rows on, then retires
            retiring = launched
            self._advance(last)
            retired = [] if launched is None else self._retire(launched)
        if retiring is None and launched is None:
            return outputs
        self._timer.stop()
        self.gate.observe(self._num_retired, self._timer.run_seconds, drafting)
        steps = None if launched is None else [step.schedules for step in launched.steps]
        self.stats.count(self._timer, steps, drafting)
        self._record(retired)
        return outputs + [output for _, finished in retired for output in finished]

    def _launch(self, drafting: bool) -> LaunchedProgram | None:
        """Plan the next program (`ProgramPlanner.plan`: one step, or several decode steps) and
        dispatch it; None (nothing dispatched) when no rank of any process has work."""
        steps = self.planner.plan(self.drafter, drafting)
        if not steps:
            return None
        bucket = steps[0].bucket
        dispatched = self._timer.device(
            self.runner.dispatch_steps, bucket, [step.batches for step in steps], drafts=drafting
        )
        self.last_bucket, self.last_schedules = bucket, steps[-1].schedules
        self.last_batches = steps[-1].batches
        self.last_program = LaunchedProgram(steps, dispatched)
        return self.last_program

    def _drafts_now(self) -> bool:
        """Whether this step drafts: every process's gate is asked about the same batch size,
        the most running of any rank, and the answers of gates that are not `uniform` are agreed
        too."""
        num_running = agree_max_int(max(len(s.running) for s in self.schedulers))
        drafts = self.gate.drafts(num_running)
        return drafts if self.gate.uniform else bool(agree_max_int(drafts))

    def _drain(self) -> list[RequestOutput]:
        """Retire the program in flight (asynchronous scheduling) before a step with drafts is
        scheduled; returns what finished in it."""
        retiring, self._in_flight = self._in_flight, None
        retired = [] if retiring is None else self._retire(retiring)
        self._record(retired)
        return [output for _, finished in retired for output in finished]

    def _advance(self, step: LaunchedStep | None) -> None:
        """The dispatched program's last step moves its rows on (`ProgramPlanner.advance`; the
        others moved on when planned). Nothing to do when no program was dispatched."""
        if step is not None:
            self.planner.advance(self.drafter, step)

    def _retire(self, program: LaunchedProgram) -> list[tuple[LaunchedStep, list[RequestOutput]]]:
        """Wait for the program's tokens and retire its steps in order; each step with what
        finished in it."""
        results = self._timer.device(self.runner.fetch_steps, program.dispatched)
        return [
            (step, self._retire_step(step, result))
            for step, result in zip(program.steps, results, strict=True)
        ]

    def _retire_step(self, step: LaunchedStep, result: StepResult) -> list[RequestOutput]:
        """Hand a step's tokens to the schedulers (verifying drafts, appending tokens, stops,
        prefix publication); logprobs, text and stream deltas; release what finished."""
        self.last_result = result
        # Per-token work beyond the token itself only when something asks for it: the plain
        # path stays as cheap as it was.
        extras = step.mode.logprobs or self.outputs.has_text or self._streaming
        sampled = [sampled_items(schedule) for schedule in step.schedules] if extras else []
        finished = []
        for rank, (schedule, batch) in enumerate(zip(step.schedules, step.batches, strict=True)):
            stale = self.schedulers[rank].in_flight.stale_decodes(schedule)
            tokens, drafts, acceptance = verified_tokens(
                schedule,
                batch.sample_rows,
                step.bucket.width,
                result.tokens[rank],
                result.accepted[rank],
                stale,
            )
            self._num_retired += len(schedule.decodes) - sum(stale) + acceptance.num_accepted
            self.stats.ranks[rank].speculation.add(acceptance)
            finished += self.schedulers[rank].retire(schedule, tokens, drafts)
            self.drafter.observe(schedule, step.bucket, result.drafts_of(rank))
        if extras:
            finished += self._stop_on_text(sampled, result)
        self.drafter.release_done()
        parts = self.outputs.new_parts(sampled, finished) if self._streaming else []
        outputs = [self._release(request) for request in finished]
        self.last_deltas += stream_deltas(parts, outputs)  # a drained step's come first
        return outputs

    def _stop_on_text(self, sampled: list[Sampled], result: StepResult) -> list[Request]:
        """Logprobs and text of this step's tokens; finish the requests whose text now holds a
        stop string. Returns those that were still running."""
        stopped = []
        for rank, request in self.outputs.process(sampled, result.logprobs):
            if not request.is_finished:  # else it ended by a stop token or length this step
                self.schedulers[rank].abort(request.request_id)
                stopped.append(request)
            request.finish_reason = FinishReason.STOP
        return stopped

    def _release(self, request: Request) -> RequestOutput:
        self.requests.remove(request.request_id)
        return self.outputs.finish(request)

    def _record(self, retired: list[tuple[LaunchedStep, list[RequestOutput]]]) -> None:
        """Keep the retired steps' records (when records are kept), each with what finished in
        it; the steps of one program share its times."""
        if not self.records.maxlen:
            return
        for step, outputs in retired:
            finished = [output.request_id for output in outputs]
            parts = (step.index, step.bucket, step.mode, step.snapshots, finished, self._timer)
            self.records.append(StepRecord.of(*parts))

    # --------------------------------------------------------------------------------- driving

    def stream(self) -> Iterator[StreamDelta]:
        """Step until every request of this process is finished, yielding what each step added
        to each request (new tokens, new text, logprobs; the final delta of a request carries its
        `RequestOutput`). Requests added meanwhile are served too."""
        while self.has_unfinished:
            yield from self.step_deltas()

    def step_deltas(self) -> list[StreamDelta]:
        """Run one step (`step`) and return what it added to each request: a `StreamDelta` per
        request given tokens (a finished request's last one carries its output). What a server's
        engine loop calls."""
        self._streaming = True
        try:
            self.step()
        finally:
            self._streaming = False
        return self.last_deltas

    def warmup(
        self,
        *,
        prefill: bool | Literal["alone"] = False,
        sampled: bool = False,
        progress: bool = False,
        workers: int = COMPILE_WORKERS,
    ) -> None:
        """Compile step variants now instead of on first use, `workers` at once: the decode-only
        ones; with `prefill="alone"` also one prefill row alone's (a request arriving at an idle
        server); with `prefill=True` every variant. Each greedy, and with `sampled` also with plain
        temperature sampling (an OpenAI client's default; with `one_sampler_program` the two
        are one program). `progress` shows a bar; `runner.warmup_progress` counts the
        `buckets.num_programs(prefill, sampled)` programs as they are ready (another thread may
        read it). The seconds spent are in `runner.compile_seconds`, apart from the steps' run
        time."""
        if self._in_flight is not None:  # its tokens would be overwritten on the device
            raise RuntimeError(
                "warmup() while a dispatched step is not retired: call it before the first "
                "step, or step until has_unfinished is False"
            )
        warm_up(
            self.runner,
            self.buckets,
            prefill=prefill,
            sampled=sampled,
            progress=progress,
            workers=workers,
        )
        self.drafter.warmup()
        self._freeze_gc()

    def _freeze_gc(self) -> None:
        """Collect, then hide every object alive now from the collector (`EngineArgs.freeze_gc`):
        the step loop's full collections then walk only what the engine made since."""
        if self.config.freeze_gc:
            gc.collect()
            gc.freeze()

    # --------------------------------------------------------------------------------- looking

    @property
    def inspect(self) -> EngineView:
        """Read-only views: `scheduler`, `last_schedule`, `last_batch` (single-rank engines),
        `block_owners(rank)`, `slot_owners(rank)`."""
        return EngineView(self)

    @property
    def num_variants(self) -> int:
        return self.runner.num_variants

    @property
    def total_compile_seconds(self) -> float:
        """Seconds compiling so far: the target's runner's and the drafter's."""
        return self.runner.total_compile_seconds + self.drafter.total_compile_seconds

    def snapshot(self) -> EngineSnapshot:
        """What a server's metrics read, as one value (`EngineSnapshot`)."""
        return EngineSnapshot.of(self)

    def __repr__(self) -> str:
        return describe_engine(self)
