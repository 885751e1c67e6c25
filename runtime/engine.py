"""`Engine`: wires scheduler, bucket policy, builder and model runner into one step loop.

`step()` = schedule -> build fresh padded inputs -> run the jitted step -> postprocess. Requests
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
from runtime.builder import StepBatch, build_step
from runtime.config import EngineConfig
from runtime.model_runner import ModelRunner
from runtime.request import Request, RequestOutput
from runtime.sampling_params import SamplingParams
from runtime.scheduler import Schedule, Scheduler


@dataclasses.dataclass
class StepStats:
    """Accumulated wall time: host (schedule + build + postprocess) and device (run) seconds."""

    num_steps: int = 0
    host_seconds: float = 0.0
    device_seconds: float = 0.0


class Engine:
    """Serve requests on one device: `add_request`, `step`, `abort`."""

    def __init__(
        self,
        model: nnx.Module,
        config: EngineConfig | None = None,
        *,
        keep_logits: bool = False,
        runner: ModelRunner | None = None,
    ) -> None:
        """Build pools, scheduler and runner; `runner` reuses compiled steps and caches of another
        engine with the same pool sizes and bucket tables (tests, notebooks)."""
        self.model_config = model.config
        self.config = (config or EngineConfig()).resolved(self.model_config.chunk_size)
        self.scheduler = Scheduler(
            self.config,
            self.model_config.chunk_size,
            uses_blocks=self.model_config.has_attention,
            uses_slots=self.model_config.has_recurrent_state,
        )
        self.buckets = BucketPolicy(self.config)
        self.runner = runner or ModelRunner(model, self.config, keep_logits=keep_logits)
        _check_same_shapes(self.runner.config, self.config)
        self.stats = StepStats()
        self.last_schedule: Schedule | None = None
        self.last_batch: StepBatch | None = None
        self._requests: dict[str, Request] = {}
        self._counter = itertools.count()
        self._device_seconds = 0.0

    def add_request(
        self,
        prompt_token_ids: Sequence[int],
        sampling_params: SamplingParams | None = None,
        request_id: str | int | None = None,
    ) -> str:
        """Queue a request; returns its id (a str: an int id means `str(request_id)`).

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
        self._requests[request_id] = request
        self.scheduler.add(request)
        return request_id

    def abort(self, request_id: str | int) -> RequestOutput | None:
        """Stop a request now and free its blocks and slot; None if it is unknown or finished."""
        request = self.scheduler.abort(checks.request_id(request_id))
        return None if request is None else self._release(request)

    @property
    def has_unfinished(self) -> bool:
        return self.scheduler.has_unfinished

    def step(self) -> list[RequestOutput]:
        """Run one engine step; returns the requests that finished in it."""
        start = time.perf_counter()
        schedule = self.scheduler.schedule()
        if schedule.is_empty:
            return []
        bucket, batch = self._build(schedule)
        tokens = self._run(bucket, batch)
        finished = self.scheduler.postprocess(schedule, tokens.tolist())
        self._count(start)
        return [self._release(request) for request in finished]

    def warmup(self) -> None:
        """Compile every decode-only bucket now (the rest compile on first use)."""
        self.runner.warmup(self.buckets.decode_buckets())

    @property
    def num_variants(self) -> int:
        return self.runner.num_variants

    def _build(self, schedule: Schedule) -> tuple[Bucket, StepBatch]:
        bucket = self.buckets.bucket_for(schedule)
        batch = build_step(
            schedule,
            bucket,
            block_size=self.config.block_size,
            max_blocks=self.config.max_blocks_per_seq,
        )
        if self.config.validate_inputs:
            batch.inputs.validate(
                block_size=self.config.block_size,
                chunk_size=self.model_config.chunk_size,
                num_blocks=self.config.num_blocks,
                num_slots=self.config.num_slots,
                vocab_size=self.model_config.vocab_size,
            )
        self.last_schedule, self.last_batch = schedule, batch
        return bucket, batch

    def _run(self, bucket: Bucket, batch: StepBatch) -> np.ndarray:
        start = time.perf_counter()
        tokens = self.runner.run(bucket, batch)
        self._device_seconds = time.perf_counter() - start
        self.stats.device_seconds += self._device_seconds
        return tokens

    def _count(self, start: float) -> None:
        self.stats.num_steps += 1
        self.stats.host_seconds += time.perf_counter() - start - self._device_seconds

    def _release(self, request: Request) -> RequestOutput:
        del self._requests[request.request_id]
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
                 "prefill_token_buckets", "prefill_row_buckets"):  # fmt: skip
        theirs, ours = getattr(runner_config, name), getattr(config, name)
        if theirs != ours:
            raise ValueError(f"{name}={ours} differs from the shared runner's {theirs}")
