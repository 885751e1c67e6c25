"""`OutputProcessor`: what a step's tokens become beyond the tokens: logprobs, text, stop strings
and stream deltas (no jax); and, as it holds the tokenizer, each structured request's grammar
matcher (`runtime.structured`), given to the request when it arrives.

The engine calls it only when a step needs it (a request asked for logprobs, the engine has a
tokenizer, or `Engine.stream` is running), so the plain token path costs what it did before.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from runtime.core.request import Request
from runtime.core.sampling_inputs import TokenLogprobs
from runtime.core.schedule import Schedule, ScheduledRequest
from runtime.outputs.detokenizer import RequestText
from runtime.outputs.request_output import RequestOutput, StreamDelta
from runtime.structured import GrammarCompiler

Sampled = list[tuple[int, ScheduledRequest]]  # (logits row, item) of the items given a token
# (request id, new token ids, new text or None, new logprobs or None) of one request in one step
Part = tuple[str, list[int], str | None, list[dict[int, float]] | None]


def sampled_items(schedule: Schedule) -> Sampled:
    """The items of `schedule` that get a token this step, with their logits row. Call it before
    `Scheduler.retire`: an item gets a token when its chunk reaches the end of the request's
    known tokens (and its request has not finished since the step was scheduled)."""
    return [
        (row, item)
        for row, item in enumerate(schedule.items)
        if item.start + item.num_tokens >= item.request.num_tokens and not item.request.is_finished
    ]


class OutputProcessor:
    """Per-request text (with a tokenizer) and how much of each request was streamed."""

    def __init__(self, tokenizer: Any = None) -> None:
        self.tokenizer = tokenizer
        self._grammars: GrammarCompiler | None = None  # made for the first structured request
        self._texts: dict[str, RequestText] = {}
        self._streamed: dict[str, int] = {}

    @property
    def has_text(self) -> bool:
        """Whether some live request has text to decode."""
        return bool(self._texts)

    def add(self, request: Request) -> None:
        """Follow a new request (its text, what was streamed); give it its grammar matcher
        when it asks for structured output (ValueError without a tokenizer)."""
        spec = request.sampling_params.structured
        if spec is not None:
            request.grammar = self._compiler(request).matcher(spec)
        self._streamed[request.request_id] = 0
        if self.tokenizer is not None:
            stop = request.sampling_params.stop
            self._texts[request.request_id] = RequestText(self.tokenizer, stop)

    def _compiler(self, request: Request) -> GrammarCompiler:
        """The engine's grammar compiler, made on first use (it reads the whole vocabulary)."""
        if self._grammars is None:
            if self.tokenizer is None:
                raise ValueError("structured outputs need a tokenizer: this engine has none")
            self._grammars = GrammarCompiler(self.tokenizer, request.eos_token_ids)
        return self._grammars

    def process(
        self, sampled: list[Sampled], logprobs: list[TokenLogprobs[np.ndarray]] | None
    ) -> list[tuple[int, Request]]:
        """Append this step's logprobs (per rank, None when the step computed none) to the
        requests that asked for them; decode the text of requests with stop strings. Returns
        (rank, request) for each request whose text now holds a stop string."""
        stopped = []
        for rank, items in enumerate(sampled):
            rank_logprobs = None if logprobs is None else logprobs[rank]
            for row, item in items:
                request = item.request
                if rank_logprobs is not None and request.logprobs is not None:
                    request.logprobs.append(_token_logprobs(rank_logprobs, row, request))
                text = self._texts.get(request.request_id)
                if text is not None and text.stop and text.update(request.output_token_ids):
                    stopped.append((rank, request))
        return stopped

    def new_parts(self, sampled: list[Sampled], finished: list[Request]) -> list[Part]:
        """What this step added to each request given a token (every rank's `sampled`); call it
        before `finish` releases the finished ones."""
        done = {request.request_id for request in finished}
        return [
            self._new_part(item.request, item.request.request_id in done)
            for items in sampled
            for _, item in items
        ]

    def _new_part(self, request: Request, finished: bool) -> Part:
        rid, outputs = request.request_id, request.output_token_ids
        seen, self._streamed[rid] = self._streamed[rid], len(outputs)
        text = self._texts.get(rid)
        new_text = None
        if text is not None:
            text.update(outputs)
            new_text = text.take(outputs, finished)
        logprobs = None if request.logprobs is None else request.logprobs[seen:]
        return rid, outputs[seen:], new_text, logprobs

    def finish(self, request: Request) -> RequestOutput:
        """Forget a finished request; returns its output, with its final text when there is a
        tokenizer."""
        output = RequestOutput.of(request)
        self._streamed.pop(request.request_id, None)
        text = self._texts.pop(request.request_id, None)
        if text is None:
            return output
        return dataclasses.replace(output, text=text.text(request.output_token_ids))


def stream_deltas(parts: list[Part], outputs: list[RequestOutput]) -> list[StreamDelta]:
    """One `StreamDelta` per part; a finished request's carries its output."""
    by_id = {output.request_id: output for output in outputs}
    return [
        StreamDelta(rid, ids, text, logprobs, rid in by_id, by_id.get(rid))
        for rid, ids, text, logprobs in parts
    ]


def _token_logprobs(
    logprobs: TokenLogprobs[np.ndarray], row: int, request: Request
) -> dict[int, float]:
    """{token: log-probability} of the request's newest token, then its top k alternatives."""
    entry = {request.output_token_ids[-1]: float(logprobs.sampled[row])}
    asked = request.sampling_params.logprobs or 0  # set: the request keeps logprobs
    for column in range(asked):
        entry.setdefault(
            int(logprobs.top_ids[row, column]), float(logprobs.top_logprobs[row, column])
        )
    return entry
