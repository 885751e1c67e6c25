"""`RequestOutput` and `StreamDelta`: what a request gives back, finished or step by step."""

from __future__ import annotations

import dataclasses
import time

from runtime.core.request import Request


@dataclasses.dataclass(frozen=True)
class RequestOutput:
    """What a finished (or aborted) request returns.

    Attributes:
      request_id: the id given to `add_request`.
      prompt_token_ids / token_ids: prompt and generated token ids.
      text: decoded generated text when a tokenizer is available, else None.
      finish_reason: "stop", "length" or "abort".
      time_to_first_token / latency: seconds from arrival (None if no token was generated).
      num_preemptions: how often the request was preempted and recomputed.
      logprobs: per generated token, {token id: log-probability} of the sampled token and the
        top `SamplingParams.logprobs` tokens; None unless asked for.
      num_cached_tokens: prompt tokens its last admission took from the prefix cache.
    """

    request_id: str
    prompt_token_ids: list[int]
    token_ids: list[int]
    finish_reason: str
    time_to_first_token: float | None
    latency: float
    num_preemptions: int = 0
    num_cached_tokens: int = 0
    text: str | None = None
    logprobs: list[dict[int, float]] | None = None

    @classmethod
    def of(cls, request: Request) -> RequestOutput:
        first = request.first_token_time
        end = request.finish_time or time.perf_counter()
        return cls(
            request_id=request.request_id,
            prompt_token_ids=list(request.prompt_token_ids),
            token_ids=list(request.output_token_ids),
            finish_reason=request.finish_reason.value if request.finish_reason else "running",
            time_to_first_token=None if first is None else first - request.arrival_time,
            latency=end - request.arrival_time,
            num_preemptions=request.num_preemptions,
            logprobs=None if request.logprobs is None else list(request.logprobs),
            num_cached_tokens=request.num_cached_tokens,
        )


@dataclasses.dataclass(frozen=True)
class StreamDelta:
    """What one engine step added to one request (`Engine.stream`, `LLM.stream`).

    Attributes:
      request_id: the request's id.
      token_ids: the tokens generated in this step.
      text: the text they complete (None without a tokenizer). Text may lag its tokens: the bytes
        of an unfinished character, and the tail that may still start a stop string, wait for
        the next step; the texts of one request's deltas add up to its final text.
      logprobs: {token id: log-probability} per new token, when the request asked for them.
      finished: whether the request finished in this step.
      output: the finished request's `RequestOutput` (None while it runs).
    """

    request_id: str
    token_ids: list[int]
    text: str | None
    logprobs: list[dict[int, float]] | None
    finished: bool
    output: RequestOutput | None = None

    @property
    def finish_reason(self) -> str | None:
        return None if self.output is None else self.output.finish_reason
