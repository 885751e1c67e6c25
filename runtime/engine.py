"""`Engine`: wires schedulers, router, bucket policy, builder and model runner into one step loop.

`step()` = schedule (every rank) -> agree on one bucket -> (speculative decoding: the drafter
proposes each decode row's drafts) -> build fresh padded inputs per rank (an idle rank gets an
all-padding step) -> run the jitted SPMD step -> postprocess per rank (keep the accepted drafts
and the target's token after them). Requests
come in through `add_request` (checked there, so a bad request never reaches a step and the other
requests keep being served) and leave through `step()`'s return value or `abort`; `stream()`
yields what each step added to each request instead. docs/architecture.md describes the design.
"""

from __future__ import annotations

import collections
import dataclasses
import gc
import itertools
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
from flax import nnx

from runtime import checks
from runtime.buckets import Bucket, BucketPolicy
from runtime.builder import StepBatch, build_dummy, build_step, with_mode
from runtime.config import EngineConfig
from runtime.distributed import agree_max
from runtime.introspection import EngineIntrospection
from runtime.model_runner import DispatchedStep, ModelRunner
from runtime.outputs import OutputProcessor, Sampled, sampled_items
from runtime.request import FinishReason, Request, RequestOutput, StreamDelta, checked_request
from runtime.router import LeastOutstandingWork, Router
from runtime.sampling_inputs import SamplingMode
from runtime.sampling_params import SamplingParams
from runtime.scheduler import Schedule, Scheduler
from runtime.speculative import make_drafter, verified_tokens
from runtime.step_record import ScheduleRecord, StepRecord
from runtime.step_stats import RankStats, StepStats, StepTimer


class Engine(EngineIntrospection):
    """Serve requests on a data-parallel mesh of one or more devices: `add_request`, `step`,
    `abort`.

    Each rank driven by this process has its own `Scheduler` (and pools, and prefix cache); a
    `Router` places each new request on one of them. Every step every rank runs, in one bucket: the
    elementwise max of what the ranks' schedules need; a rank with nothing scheduled runs an
    all-padding step.

    With a `tokenizer` (a `tokenizers.Tokenizer`) outputs carry text and requests may use stop
    strings. For looking inside: `records` (the latest steps as `StepRecord`s), `request(id)`,
    `block_owners(rank)` / `slot_owners(rank)`, `stats`.
    """

    def __init__(
        self,
        model: nnx.Module,
        config: EngineConfig | None = None,
        *,
        keep_logits: bool = False,
        runner: ModelRunner | None = None,
        router: Router | None = None,
        tokenizer: Any = None,
        draft_model: nnx.Module | None = None,
        draft_runner: ModelRunner | None = None,
    ) -> None:
        """Build pools, schedulers and runner; `runner` reuses compiled steps and caches of another
        engine with the same pool sizes and bucket tables (tests, notebooks). With
        `config.speculative.method == "draft_model"`, `draft_model` is the draft model (default:
        loaded from `config.speculative.draft_model`) and `draft_runner` may share its compiled
        steps and caches likewise."""
        self.model_config = model.config
        self.config = (config or EngineConfig()).resolved(self.model_config.chunk_size)
        self.runner = runner or ModelRunner(model, self.config, keep_logits=keep_logits)
        self.config.check_same_shapes(self.runner.config, "the shared runner")
        self.ranks = self.runner.local_ranks
        self.schedulers = [
            Scheduler(
                self.config,
                self.model_config.chunk_size,
                uses_blocks=self.model_config.has_attention,
                uses_slots=self.model_config.has_recurrent_state,
            )
            for _ in self.ranks
        ]
        self.router = router or LeastOutstandingWork()
        spec = self.config.speculative
        self.buckets = BucketPolicy(self.config, width=1 if spec is None else spec.width)
        self.drafter = make_drafter(self.config, model, len(self.ranks), draft_model, draft_runner)
        self.stats = StepStats(ranks=[
            RankStats(prefix_cache=s.prefix_cache.stats if s.prefix_cache else None)
            for s in self.schedulers
        ])  # fmt: skip
        self.last_bucket: Bucket | None = None
        self.last_schedules: list[Schedule] = []
        self.last_batches: list[StepBatch] = []
        self._requests: dict[str, Request] = {}
        self._rank_of: dict[str, int] = {}
        self._counter = itertools.count()
        self._timer = StepTimer(self.runner)
        self._num_launched = 0
        self._in_flight: _Launched | None = None  # asynchronous scheduling: dispatched, unretired
        self.tokenizer = tokenizer
        self.records: collections.deque[StepRecord] = collections.deque(
            maxlen=self.config.step_records
        )
        self.last_deltas: list[StreamDelta] = []  # filled while `stream()` drives the engine
        self._streaming = False
        self.outputs = OutputProcessor(tokenizer)
        self._freeze_gc()

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
        if params.logprobs is not None and self.config.speculative is not None:
            raise ValueError(f"logprobs={params.logprobs}: log-probabilities are not computed "
                             "with speculative decoding (ask for them on an engine without "
                             "`speculative`)")  # fmt: skip
        given = None if request_id is None else checks.request_id(request_id)
        if given in self._requests:
            raise ValueError(f"request_id={given!r} is already in use")
        number = next(self._counter)  # only accepted requests count: seeds stay reproducible
        request_id = str(number) if given is None else given
        if request_id in self._requests:
            raise ValueError(f"request_id={request_id!r} (from the arrival count) is in use")
        seed = params.seed if params.seed is not None else (self.config.seed * 1_000_003 + number)
        request = Request(request_id, prompt, params, seed=seed % 2**32,
                          eos_token_ids=self.model_config.eos_token_ids)  # fmt: skip
        rank = self.router.place(request, self.schedulers)
        self._requests[request_id] = request
        self._rank_of[request_id] = rank
        self.outputs.add(request)
        self.schedulers[rank].add(request)
        return request_id

    def abort(self, request_id: str | int) -> RequestOutput | None:
        """Stop a request now and free its blocks and slot; None if it is unknown or finished."""
        request_id = checks.request_id(request_id)
        rank = self._rank_of.get(request_id)
        request = None if rank is None else self.schedulers[rank].abort(request_id)
        if request is not None and self.drafter is not None:
            self.drafter.release_done()
        return None if request is None else self._release(request)

    def rank_of(self, request_id: str) -> int:
        """The global data-parallel rank serving a live request."""
        return self.ranks[self._rank_of[checks.request_id(request_id)]]

    @property
    def has_unfinished(self) -> bool:
        """Whether a rank of this process holds a waiting or running request, or a dispatched
        step whose tokens have not been retired (asynchronous scheduling)."""
        return self._in_flight is not None or any(s.has_unfinished for s in self.schedulers)

    def any_unfinished(self) -> bool:
        """Whether any process holds unfinished requests (a collective in a multi-host run: every
        process calls it at the same point of its loop)."""
        return bool(agree_max(np.array([self.has_unfinished], np.int32))[0])

    def step(self) -> list[RequestOutput]:
        """Run one engine step on every rank; returns the requests that finished in it (with
        `async_scheduling`: in the step before, whose tokens this step's retirement brought to
        the host).

        In a multi-host run every process calls `step()` in lockstep (it agrees on the bucket and
        the sampler mode).
        """
        self._timer.start()
        self.last_deltas = []  # a step that retires nothing streams nothing
        launched = self._launch()
        if self.config.async_scheduling:  # retire step N - 1 while N runs, then N moves rows on
            retiring, self._in_flight = self._in_flight, launched
            outputs = [] if retiring is None else self._retire(retiring)
            self._advance(launched)
        else:  # N moves rows on, then retires
            retiring = launched
            self._advance(launched)
            outputs = [] if launched is None else self._retire(launched)
        if retiring is None and launched is None:
            return []
        self._timer.stop()
        self.stats.count(self._timer, None if launched is None else launched.schedules)
        if self.records.maxlen and retiring is not None:
            self._record(retiring, outputs)
        return outputs

    def _launch(self) -> _Launched | None:
        """Schedule every rank, agree on a bucket, build and dispatch the step; None (nothing
        dispatched) when no rank of any process has work."""
        num_drafts = None if self.drafter is None else self.drafter.num_wanted
        schedules = [s.schedule(num_drafts) for s in self.schedulers]
        agreed = self._agree(schedules)
        if agreed is None:
            return None
        bucket, mode = agreed
        snapshots = [ScheduleRecord.of(s) for s in schedules] if self.records.maxlen else []
        if self.drafter is not None:
            self.drafter.propose(schedules, bucket)
        batches = [
            with_mode(self._build(scheduler, schedule, bucket), mode)
            for scheduler, schedule in zip(self.schedulers, schedules, strict=True)
        ]
        dispatched = self._timer.device(self.runner.dispatch, bucket, batches,
                                       carry=self.config.async_scheduling)  # fmt: skip
        self.last_bucket, self.last_schedules, self.last_batches = bucket, schedules, batches
        self._num_launched += 1
        return _Launched(self._num_launched - 1, bucket, mode, schedules, batches, dispatched,
                         snapshots)  # fmt: skip

    def _advance(self, step: _Launched | None) -> None:
        """The dispatched step's rows move on (`Scheduler.advance`): the next step can be
        scheduled before its tokens are known. Nothing to do when no step was dispatched."""
        if step is None:
            return
        for scheduler, schedule, batch in zip(self.schedulers, step.schedules, step.batches,
                                              strict=True):  # fmt: skip
            scheduler.advance(schedule, batch.sample_rows)

    def _retire(self, step: _Launched) -> list[RequestOutput]:
        """Wait for the step's tokens and hand them to the schedulers (appending tokens, stops,
        prefix publication); logprobs, text and stream deltas; release what finished."""
        results = self._timer.device(self.runner.fetch, step.dispatched)
        # Per-token work beyond the token itself only when something asks for it: the plain
        # path stays as cheap as it was.
        extras = step.mode.logprobs or self.outputs.has_text or self._streaming
        sampled = [sampled_items(schedule) for schedule in step.schedules] if extras else []
        finished = []
        for i, (schedule, batch) in enumerate(zip(step.schedules, step.batches, strict=True)):
            finished += self._postprocess(i, schedule, batch, results[i], step.bucket.width)
        if extras:
            finished += self._process_outputs(sampled)
        if self.drafter is not None:
            self.drafter.release_done()
        return self._finish(sampled, finished)

    def stream(self) -> Iterator[StreamDelta]:
        """Step until every request of this process is finished, yielding what each step added
        to each request (new tokens, new text, logprobs; the final delta of a request carries its
        `RequestOutput`). Requests added meanwhile are served too."""
        self._streaming = True
        try:
            while self.has_unfinished:
                self.step()
                yield from self.last_deltas
        finally:
            self._streaming = False

    def warmup(self, *, prefill: bool = False, progress: bool = False) -> None:
        """Compile every decode-only step variant now, with `prefill` every variant the config
        can use (the rest compile on first use); `progress` shows a bar. The seconds spent are
        in `runner.compile_seconds`, apart from the steps' run time."""
        if self._in_flight is not None:  # its tokens would be overwritten on the device
            raise RuntimeError("warmup() while a dispatched step is not retired: call it before "
                               "the first step, or step until has_unfinished is False")  # fmt: skip
        buckets = self.buckets.all_buckets() if prefill else self.buckets.decode_buckets()
        self.runner.warmup(buckets, carry=self.config.async_scheduling, progress=progress)
        if self.drafter is not None:
            self.drafter.warmup()
        self._freeze_gc()

    def _freeze_gc(self) -> None:
        """Collect, then hide every object alive now from the collector (`EngineConfig.freeze_gc`):
        the step loop's full collections then walk only what the engine made since."""
        if self.config.freeze_gc:
            gc.collect()
            gc.freeze()

    @property
    def num_variants(self) -> int:
        return self.runner.num_variants

    def _agree(self, schedules: list[Schedule]) -> tuple[Bucket, SamplingMode] | None:
        """Elementwise max of the ranks' buckets and sampler modes, over every process; None if no
        rank of any process has work (then no step runs anywhere)."""
        sizes = Bucket.NUM_FIELDS
        needs = np.zeros(sizes + SamplingMode.NUM_FIELDS, np.int32)
        for schedule in schedules:
            if not schedule.is_empty:
                bucket = self.buckets.bucket_for(schedule).as_array()
                needs = np.maximum(needs, np.concatenate([bucket, self._mode_of(schedule)]))
        agreed = agree_max(needs)
        if not agreed[:sizes].any():
            return None
        return Bucket.from_array(agreed[:sizes]), SamplingMode.from_array(agreed[sizes:])

    @staticmethod
    def _mode_of(schedule: Schedule) -> np.ndarray:
        return SamplingMode.of_requests([item.request for item in schedule.items]).as_array()

    def _build(self, scheduler: Scheduler, schedule: Schedule, bucket: Bucket) -> StepBatch:
        max_blocks, boundary = self.config.max_blocks_per_seq, self.config.boundary_block_size
        if schedule.is_empty:  # an idle rank: the all-padding dummy step
            batch = build_dummy(bucket, max_blocks=max_blocks, state_block_size=boundary)
        else:
            batch = build_step(schedule, bucket, block_size=self.config.block_size,
                               max_blocks=max_blocks, state_block_size=boundary)  # fmt: skip
        if self.config.validate_inputs:
            cache = scheduler.prefix_cache
            batch.inputs.validate(
                block_size=self.config.block_size,
                chunk_size=self.model_config.chunk_size,
                num_blocks=self.config.num_blocks,
                num_slots=self.config.num_slots,
                vocab_size=self.model_config.vocab_size,
                published_slots=None if cache is None else cache.published_slots,
                published_blocks=None if cache is None else cache.published_blocks,
            )
            batch.validate_token_sources(self.runner.num_carried)
        return batch

    def _postprocess(
        self, rank: int, schedule: Schedule, batch: StepBatch, result: np.ndarray, width: int
    ) -> list[Request]:
        """Hand rank `rank`'s sampled tokens ([2, N]: tokens, accept flags) to its scheduler."""
        tokens = result[0]
        if self.drafter is None:
            return self.schedulers[rank].retire(schedule, tokens[batch.sample_rows].tolist())
        sampled, drafts, stats = verified_tokens(schedule, batch.sample_rows, width, tokens,
                                                 result[1])  # fmt: skip
        self.stats.ranks[rank].speculation = self.stats.ranks[rank].speculation.add(stats)
        return self.schedulers[rank].retire(schedule, sampled, drafts)

    def _process_outputs(self, sampled: list[Sampled]) -> list[Request]:
        """Logprobs and text of this step's tokens; finish the requests whose text now holds a
        stop string. Returns those that were still running."""
        stopped = []
        logprobs = self.runner.last_logprobs
        for rank, items in enumerate(sampled):
            lp = None if logprobs is None else logprobs[rank]
            for request in self.outputs.process(items, lp):
                if not request.is_finished:  # else it ended by a stop token or length this step
                    self.schedulers[rank].abort(request.request_id)
                    stopped.append(request)
                request.finish_reason = FinishReason.STOP
        return stopped

    def _finish(self, sampled: list[Sampled], finished: list[Request]) -> list[RequestOutput]:
        """Release the finished requests; while streaming, set `last_deltas`."""
        done = {request.request_id for request in finished}
        parts = []
        if self._streaming:
            for items in sampled:
                parts += [self.outputs.new_part(item.request, item.request.request_id in done)
                          for _, item in items]  # fmt: skip
        outputs = [self._release(request) for request in finished]
        by_id = {output.request_id: output for output in outputs}
        self.last_deltas = [StreamDelta(rid, ids, text, lps, rid in by_id, by_id.get(rid))
                            for rid, ids, text, lps in parts]  # fmt: skip
        return outputs

    def _record(self, step: _Launched, outputs: list[RequestOutput]) -> None:
        self.records.append(StepRecord(
            index=step.index, bucket=step.bucket, mode=step.mode, schedules=tuple(step.snapshots),
            finished=tuple(output.request_id for output in outputs),
            host_ms=self._timer.host_seconds * 1e3, device_ms=self._timer.device_seconds * 1e3,
            compile_seconds=self._timer.compile_seconds,
        ))  # fmt: skip

    def _release(self, request: Request) -> RequestOutput:
        del self._requests[request.request_id]
        del self._rank_of[request.request_id]
        output = RequestOutput.of(request)
        text = self.outputs.release(request)
        return output if text is None else dataclasses.replace(output, text=text)

    def check_request(
        self, prompt_token_ids: Sequence[int], sampling_params: SamplingParams | None = None
    ) -> tuple[list[int], SamplingParams]:
        """(prompt as a list of ints, sampling params) for this engine's model; ValueError
        naming what is wrong (`runtime.request.checked_request`)."""
        return checked_request(prompt_token_ids, sampling_params,
                               vocab_size=self.model_config.vocab_size,
                               max_model_len=self.config.max_model_len)  # fmt: skip


@dataclasses.dataclass(frozen=True)
class _Launched:
    """A dispatched step and what its retirement needs: its number, shape, sampler mode, each
    rank's schedule and batch, the device handle, and (with step records) the schedules' records."""

    index: int
    bucket: Bucket
    mode: SamplingMode
    schedules: list[Schedule]
    batches: list[StepBatch]
    dispatched: DispatchedStep
    snapshots: list[ScheduleRecord]
