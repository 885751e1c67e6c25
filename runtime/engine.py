"""`Engine`: wires schedulers, router, bucket policy, builder and model runner into one step loop.

`step()` = schedule (every rank) -> agree on one bucket -> build fresh padded inputs per rank (an
idle rank gets an all-padding step) -> run the jitted SPMD step -> postprocess per rank. Requests
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

from runtime.buckets import Bucket, BucketPolicy
from runtime.builder import StepBatch, build_dummy, build_step
from runtime.config import EngineConfig
from runtime.distributed import agree_max
from runtime.model_runner import ModelRunner
from runtime.request import Request, RequestOutput
from runtime.router import LeastOutstandingWork, Router
from runtime.sampling_params import SamplingParams
from runtime.scheduler import Schedule, Scheduler


@dataclasses.dataclass
class RankStats:
    """Per data-parallel rank: steps with live rows, idle (all-padding) steps, tokens computed."""

    num_live_steps: int = 0
    num_idle_steps: int = 0
    num_tokens: int = 0


@dataclasses.dataclass
class StepStats:
    """Accumulated wall time: host (schedule + build + postprocess) and device (run) seconds."""

    num_steps: int = 0
    host_seconds: float = 0.0
    device_seconds: float = 0.0
    ranks: list[RankStats] = dataclasses.field(default_factory=list)


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
    ) -> None:
        """Build pools, schedulers and runner; `runner` reuses compiled steps and caches of another
        engine with the same pool sizes and bucket tables (tests, notebooks)."""
        self.config = config or EngineConfig()
        self.model_config = model.config
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
        self.buckets = BucketPolicy(self.config)
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
        request_id: str | None = None,
    ) -> str:
        """Queue a request on the rank the router picks; returns its id. Raises ValueError (and
        queues nothing) on bad input."""
        params = sampling_params or SamplingParams()
        if not isinstance(params, SamplingParams):
            raise ValueError(f"sampling_params={params!r} must be a SamplingParams")
        prompt = self._check_prompt(prompt_token_ids)
        number = next(self._counter)
        request_id = str(number) if request_id is None else str(request_id)
        if request_id in self._requests:
            raise ValueError(f"request_id={request_id!r} is already in use")
        seed = params.seed if params.seed is not None else (self.config.seed * 1_000_003 + number)
        request = Request(request_id, prompt, params, seed=seed % 2**32)
        rank = self.router.place(request, self.schedulers)
        self._requests[request_id] = request
        self._rank_of[request_id] = rank
        self.schedulers[rank].add(request)
        return request_id

    def abort(self, request_id: str) -> RequestOutput | None:
        """Stop a request now and free its blocks and slot; None if it is unknown or finished."""
        rank = self._rank_of.get(str(request_id))
        if rank is None:
            return None
        request = self.schedulers[rank].abort(str(request_id))
        return None if request is None else self._release(request)

    def rank_of(self, request_id: str) -> int:
        """The global data-parallel rank serving a live request."""
        return self.ranks[self._rank_of[str(request_id)]]

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

        In a multi-host run every process calls `step()` in lockstep (it agrees on the bucket).
        """
        start = time.perf_counter()
        schedules = [s.schedule() for s in self.schedulers]
        bucket = self._agree_bucket(schedules)
        if bucket is None:
            return []
        batches = [self._build(schedule, bucket) for schedule in schedules]
        tokens = self._run(bucket, batches)
        finished = []
        for scheduler, schedule, sampled in zip(self.schedulers, schedules, tokens, strict=True):
            finished += scheduler.postprocess(schedule, sampled.tolist())
        self.last_bucket, self.last_schedules, self.last_batches = bucket, schedules, batches
        self._count(start, schedules)
        return [self._release(request) for request in finished]

    def warmup(self) -> None:
        """Compile every decode-only bucket now (the rest compile on first use)."""
        self.runner.warmup(self.buckets.decode_buckets())

    @property
    def num_variants(self) -> int:
        return self.runner.num_variants

    def _agree_bucket(self, schedules: list[Schedule]) -> Bucket | None:
        """The elementwise max of the ranks' buckets, over every process; None if no rank of any
        process has work (then no step runs anywhere)."""
        needs = [self.buckets.bucket_for(s).as_array() for s in schedules if not s.is_empty]
        local = np.max(needs, axis=0) if needs else np.zeros(Bucket.NUM_FIELDS, np.int32)
        agreed = agree_max(local.astype(np.int32))
        return Bucket.from_array(agreed) if agreed.any() else None

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

    def _check_prompt(self, prompt_token_ids: Sequence[int]) -> list[int]:
        try:
            prompt = np.asarray(prompt_token_ids, dtype=np.int64).reshape(-1).tolist()
        except (TypeError, ValueError, OverflowError) as error:
            raise ValueError(f"prompt_token_ids must be a list of ints: {error}") from None
        max_len, vocab = self.config.max_model_len, self.model_config.vocab_size
        if not prompt:
            raise ValueError("prompt_token_ids is empty: a prompt needs at least one token")
        if len(prompt) > max_len:
            raise ValueError(f"prompt has {len(prompt)} tokens, more than max_model_len={max_len}")
        bad = [t for t in prompt if not 0 <= t < vocab]
        if bad:
            raise ValueError(f"prompt token ids {bad[:8]} are outside the vocabulary [0, {vocab})")
        return prompt


def _check_same_shapes(runner_config: EngineConfig, config: EngineConfig) -> None:
    for name in ("num_blocks", "num_slots", "block_size", "max_model_len", "decode_row_buckets",
                 "prefill_token_buckets", "prefill_row_buckets", "data_parallel_size"):  # fmt: skip
        theirs, ours = getattr(runner_config, name), getattr(config, name)
        if theirs != ours:
            raise ValueError(f"{name}={ours} differs from the shared runner's {theirs}")
