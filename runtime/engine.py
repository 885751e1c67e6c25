"""`Engine`: wires schedulers, router, bucket policy, builder and model runner into one step loop.

`step()` = schedule (every rank) -> agree on one bucket -> (speculative decoding: the drafter
proposes each decode row's drafts) -> build fresh padded inputs per rank (an idle rank gets an
all-padding step) -> run the jitted SPMD step -> postprocess per rank (keep the accepted drafts
and the target's token after them). Requests
come in through `add_request` (checked there, so a bad request never reaches a step and the other
requests keep being served) and leave through `step()`'s return value or `abort`.
"""

from __future__ import annotations

import dataclasses
import itertools
import time
from collections.abc import Sequence

import numpy as np
from flax import nnx

from runtime import checks
from runtime.buckets import Bucket, BucketPolicy
from runtime.builder import StepBatch, build_dummy, build_step, with_mode
from runtime.config import EngineConfig
from runtime.distributed import agree_max
from runtime.model_runner import ModelRunner
from runtime.ngram import NgramDrafter
from runtime.request import Request, RequestOutput
from runtime.router import LeastOutstandingWork, Router
from runtime.sampling_inputs import SamplingMode
from runtime.sampling_params import SamplingParams
from runtime.scheduler import Schedule, Scheduler
from runtime.speculative import Drafter, SpeculationStats, verified_tokens


@dataclasses.dataclass
class RankStats:
    """Per data-parallel rank: steps with live rows, idle (all-padding) steps, tokens computed
    (drafts fed included), and the speculative acceptance counters."""

    num_live_steps: int = 0
    num_idle_steps: int = 0
    num_tokens: int = 0
    speculation: SpeculationStats = dataclasses.field(default_factory=SpeculationStats)


@dataclasses.dataclass
class StepStats:
    """Accumulated wall time: host (schedule + build + postprocess) and device (run) seconds."""

    num_steps: int = 0
    host_seconds: float = 0.0
    device_seconds: float = 0.0
    ranks: list[RankStats] = dataclasses.field(default_factory=list)

    @property
    def speculation(self) -> SpeculationStats:
        """Acceptance counters summed over ranks (`acceptance_rate`, `mean_acceptance_length`)."""
        total = SpeculationStats()
        for rank in self.ranks:
            total = total.add(rank.speculation)
        return total


class Engine:
    """Serve requests on a data-parallel mesh of one or more devices: `add_request`, `step`,
    `abort`.

    Each rank driven by this process has its own `Scheduler` (and pools); a `Router` places each
    new request on one of them. Every step every rank runs, in one bucket: the elementwise max of
    what the ranks' schedules need; a rank with nothing scheduled runs an all-padding step.
    """

    def __init__(
        self,
        model: nnx.Module,
        config: EngineConfig | None = None,
        *,
        keep_logits: bool = False,
        runner: ModelRunner | None = None,
        router: Router | None = None,
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
        _check_same_shapes(self.runner.config, self.config)
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
        self.drafter = self._make_drafter(model, draft_model, draft_runner)
        self.stats = StepStats(ranks=[RankStats() for _ in self.ranks])
        self.last_bucket: Bucket | None = None
        self.last_schedules: list[Schedule] = []
        self.last_batches: list[StepBatch] = []
        self._requests: dict[str, Request] = {}
        self._rank_of: dict[str, int] = {}
        self._counter = itertools.count()
        self._device_seconds = 0.0

    @property
    def scheduler(self) -> Scheduler:
        """The scheduler of a single-rank engine (`schedulers[i]` serves rank `ranks[i]`)."""
        return self._only_rank(self.schedulers)

    @property
    def last_schedule(self) -> Schedule | None:
        """The last step's schedule of a single-rank engine (`last_schedules` per rank)."""
        return self._only_rank(self.last_schedules)

    @property
    def last_batch(self) -> StepBatch | None:
        """The last step's inputs of a single-rank engine (`last_batches` per rank)."""
        return self._only_rank(self.last_batches)

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
        """Whether a rank of this process holds a waiting or running request."""
        return any(s.has_unfinished for s in self.schedulers)

    def any_unfinished(self) -> bool:
        """Whether any process holds unfinished requests (a collective in a multi-host run: every
        process calls it at the same point of its loop)."""
        return bool(agree_max(np.array([self.has_unfinished], np.int32))[0])

    def step(self) -> list[RequestOutput]:
        """Run one engine step on every rank; returns the requests that finished in it.

        In a multi-host run every process calls `step()` in lockstep (it agrees on the bucket and
        the sampler mode).
        """
        start = time.perf_counter()
        num_drafts = None if self.drafter is None else self.drafter.num_wanted
        schedules = [s.schedule(num_drafts) for s in self.schedulers]
        agreed = self._agree(schedules)
        if agreed is None:
            return []
        bucket, mode = agreed
        if self.drafter is not None:
            self.drafter.propose(schedules, bucket)
        batches = [with_mode(self._build(schedule, bucket), mode) for schedule in schedules]
        results = self._run(bucket, batches)
        finished = []
        for i, (schedule, batch) in enumerate(zip(schedules, batches, strict=True)):
            finished += self._postprocess(i, schedule, batch, results[i], bucket.width)
        if self.drafter is not None:
            self.drafter.release_done()
        self.last_bucket, self.last_schedules, self.last_batches = bucket, schedules, batches
        self._count(start, schedules)
        return [self._release(request) for request in finished]

    def warmup(self) -> None:
        """Compile every decode-only bucket now (the rest compile on first use)."""
        self.runner.warmup(self.buckets.decode_buckets())
        if self.drafter is not None:
            self.drafter.warmup()

    @property
    def num_variants(self) -> int:
        return self.runner.num_variants

    def _agree(self, schedules: list[Schedule]) -> tuple[Bucket, SamplingMode] | None:
        """Elementwise max of the ranks' buckets and sampler modes, over every process; None if no
        rank of any process has work (then no step runs anywhere)."""
        sizes = Bucket.NUM_FIELDS
        needs = np.zeros(sizes + 3, np.int32)
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

    def _build(self, schedule: Schedule, bucket: Bucket) -> StepBatch:
        max_blocks = self.config.max_blocks_per_seq
        if schedule.is_empty:  # an idle rank: the all-padding dummy step
            batch = build_dummy(bucket, max_blocks=max_blocks)
        else:
            batch = build_step(schedule, bucket, block_size=self.config.block_size,
                               max_blocks=max_blocks)  # fmt: skip
        if self.config.validate_inputs:
            batch.inputs.validate(
                block_size=self.config.block_size,
                chunk_size=self.model_config.chunk_size,
                num_blocks=self.config.num_blocks,
                num_slots=self.config.num_slots,
                vocab_size=self.model_config.vocab_size,
            )
        return batch

    def _postprocess(
        self, rank: int, schedule: Schedule, batch: StepBatch, result: np.ndarray, width: int
    ) -> list[Request]:
        """Hand rank `rank`'s sampled tokens ([2, N]: tokens, accept flags) to its scheduler."""
        tokens = result[0]
        if self.drafter is None:
            return self.schedulers[rank].postprocess(schedule, tokens[batch.sample_rows].tolist())
        sampled, drafts, stats = verified_tokens(schedule, batch.sample_rows, width, tokens,
                                                 result[1])  # fmt: skip
        self.stats.ranks[rank].speculation = self.stats.ranks[rank].speculation.add(stats)
        return self.schedulers[rank].postprocess(schedule, sampled, drafts)

    def _make_drafter(
        self, model: nnx.Module, draft_model: nnx.Module | None, draft_runner: ModelRunner | None
    ) -> Drafter | None:
        spec = self.config.speculative
        if spec is None or spec.method == "ngram":
            if draft_model is not None or draft_runner is not None:
                raise ValueError("draft_model / draft_runner need speculative method 'draft_model'")
            return None if spec is None else NgramDrafter(spec)
        from runtime.draft_model import DraftModelDrafter, check_draft_model

        if draft_model is None:
            if spec.draft_model is None:
                raise ValueError("speculative method 'draft_model' needs draft_model: a checkpoint "
                                 "directory or preset name, or the model object")  # fmt: skip
            from runtime.llm import load_model

            draft_model, _ = load_model(spec.draft_model, seed=self.config.seed)
        check_draft_model(draft_model, model)
        return DraftModelDrafter(draft_model, self.config, self.model_config.chunk_size,
                                 len(self.ranks), runner=draft_runner)  # fmt: skip

    def _run(self, bucket: Bucket, batches: list[StepBatch]) -> list[np.ndarray]:
        start = time.perf_counter()
        tokens = self.runner.run(bucket, batches)
        self._device_seconds = time.perf_counter() - start
        self.stats.device_seconds += self._device_seconds
        return tokens

    def _count(self, start: float, schedules: list[Schedule]) -> None:
        self.stats.num_steps += 1
        self.stats.host_seconds += time.perf_counter() - start - self._device_seconds
        for rank, schedule in zip(self.stats.ranks, schedules, strict=True):
            if schedule.is_empty:
                rank.num_idle_steps += 1
            else:
                rank.num_live_steps += 1
                rank.num_tokens += sum(item.num_tokens for item in schedule.items)

    def _only_rank[T](self, per_rank: list[T]) -> T | None:
        if len(self.schedulers) != 1:
            raise ValueError(
                f"this engine drives {len(self.schedulers)} ranks: index the per-rank list"
            )
        return per_rank[0] if per_rank else None

    def _release(self, request: Request) -> RequestOutput:
        del self._requests[request.request_id]
        del self._rank_of[request.request_id]
        return RequestOutput.of(request)

    def check_request(
        self, prompt_token_ids: Sequence[int], sampling_params: SamplingParams | None = None
    ) -> tuple[list[int], SamplingParams]:
        """(prompt as a list of ints, sampling params); ValueError naming what is wrong.

        The prompt needs 1 to max_model_len - 1 int ids inside the vocabulary (prompt + output
        never exceeds max_model_len); stop ids must be inside the vocabulary too.
        """
        params = SamplingParams() if sampling_params is None else sampling_params
        if not isinstance(params, SamplingParams):
            raise ValueError(f"sampling_params={params!r} must be a SamplingParams")
        vocab, max_len = self.model_config.vocab_size, self.config.max_model_len
        prompt = checks.token_ids("prompt_token_ids", prompt_token_ids, vocab)
        checks.token_ids("stop_token_ids", params.stop_token_ids, vocab)
        if not prompt:
            raise ValueError("prompt_token_ids is empty: a prompt needs at least one token")
        if len(prompt) >= max_len:
            raise ValueError(
                f"prompt has {len(prompt)} tokens: with max_model_len={max_len} it leaves no room "
                f"to generate (prompt + output <= max_model_len, so at most {max_len - 1})"
            )
        return prompt, params


def _check_same_shapes(runner_config: EngineConfig, config: EngineConfig) -> None:
    for name in ("num_blocks", "num_slots", "block_size", "max_model_len", "decode_row_buckets",
                 "prefill_token_buckets", "prefill_row_buckets", "data_parallel_size"):  # fmt: skip
        theirs, ours = getattr(runner_config, name), getattr(config, name)
        if theirs != ours:
            raise ValueError(f"{name}={ours} differs from the shared runner's {theirs}")
