"""A request's choices in flight: their delta streams merged into one, and what they become, a
whole response object or the server-sent chunks of a streamed one (`/v1/completions` and
`/v1/chat/completions` shapes). A chat answer is read by the request's tool parser: its calls
come out as `tool_calls` (streamed: each as a delta once its block has closed) and the choice
finishes with "tool_calls"."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncGenerator, AsyncIterator
from typing import Any

from runtime.outputs.request_output import StreamDelta
from runtime.serve.async_engine import EngineError
from runtime.serve.errors import error_body
from runtime.serve.metrics import Metrics
from runtime.serve.responses import (
    Choice,
    Decoder,
    chat_logprobs,
    completion_logprobs,
    envelope,
    usage,
)
from runtime.serve.tool_parsers import ToolParser


async def merged(
    streams: list[AsyncGenerator[StreamDelta]],
) -> AsyncIterator[tuple[int, StreamDelta]]:
    """(stream index, delta) as the streams produce them, until every one ends; an error of one
    ends them all. Closing this iterator (a client that left) closes every stream, which aborts
    its request."""
    if len(streams) == 1:  # the common n = 1: no task and queue between the stream and us
        (stream,) = streams
        try:
            async for delta in stream:
                yield 0, delta
        finally:
            await stream.aclose()
        return
    queue: asyncio.Queue[tuple[int, StreamDelta | Exception | None]] = asyncio.Queue()

    async def pump(index: int, stream: AsyncGenerator[StreamDelta]) -> None:
        try:
            async for delta in stream:
                await queue.put((index, delta))
        except EngineError as error:
            await queue.put((index, error))
        finally:
            await queue.put((index, None))

    tasks = [asyncio.create_task(pump(i, stream)) for i, stream in enumerate(streams)]
    remaining = len(tasks)
    try:
        while remaining:
            index, item = await queue.get()
            if item is None:
                remaining -= 1
            elif isinstance(item, Exception):
                raise item
            else:
                yield index, item
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


class Completion:
    """The choices of one request (`n` per prompt, in order) and their timing for the metrics;
    `prompt_tokens` counts each prompt once, as OpenAI's usage does (and its cached tokens are
    those of the prompt's first choice)."""

    def __init__(
        self,
        response_id: str,
        model_name: str,
        streams: list[AsyncGenerator[StreamDelta]],
        prompt_tokens: int,
        include_usage: bool,
        logprobs_k: int | None,
        metrics: Metrics,
        decoder: Decoder,
        tool_parser: ToolParser,
        n: int = 1,
    ) -> None:
        """`tool_parser`: how a chat answer is read (`NoToolParser`: all content)."""
        self.response_id, self.model_name, self.n = response_id, model_name, n
        self.streams, self.prompt_tokens = streams, prompt_tokens
        self.include_usage, self.logprobs_k = include_usage, logprobs_k
        self.metrics, self.decoder = metrics, decoder
        self.choices = [Choice(i) for i in range(len(streams))]
        self.tool_parser = tool_parser
        self._tool_streams = [tool_parser.stream() for _ in streams]
        self._num_calls = [0] * len(streams)  # per choice: tool calls streamed so far
        self._text_offsets = [0] * len(streams)  # per choice: where its next streamed chunk starts
        self._arrival = time.perf_counter()
        self._first: dict[int, float] = {}

    async def collect(self, chat: bool) -> dict[str, Any]:
        """The whole response object once every choice has finished."""
        async for index, delta in merged(self.streams):
            self._add(index, delta)
        kind = "chat.completion" if chat else "text_completion"
        response = envelope(kind, self.response_id, self.model_name)
        if self.logprobs_k is None:
            response["choices"] = self._choices(chat)
        else:  # a piece per token and alternative: long for a long answer, so off the loop
            response["choices"] = await asyncio.to_thread(self._choices, chat)
        response["usage"] = self._usage()
        return response

    def _choices(self, chat: bool) -> list[dict[str, Any]]:
        return [self._choice(choice, chat) for choice in self.choices]

    async def sse(self, chat: bool) -> AsyncIterator[str]:
        """Server-sent events: a chunk per choice per engine step, then the usage chunk when
        asked for, then `[DONE]`; an engine failure ends the stream with an error event."""
        kind = "chat.completion.chunk" if chat else "text_completion"
        try:
            if chat:  # the role comes first, as OpenAI's chunks do
                yield _event(self._chunk(kind, [self._role(c.index) for c in self.choices]))
            async for index, delta in merged(self.streams):
                self._add(index, delta)
                yield _event(self._chunk(kind, [self._delta_choice(index, delta, chat)]))
            if self.include_usage:
                final = self._chunk(kind, [])
                final["usage"] = self._usage()
                yield _event(final)
        except EngineError as error:
            yield _event(error_body(str(error), kind="server_error"))
        yield "data: [DONE]\n\n"

    def _add(self, index: int, delta: StreamDelta) -> None:
        self.choices[index].add(delta)
        now = time.perf_counter()
        if delta.token_ids and index not in self._first:
            self._first[index] = now
        if delta.finished:
            first = self._first.get(index)
            choice = self.choices[index]
            self.metrics.finish(
                choice.finish_reason or "abort",
                None if first is None else first - self._arrival,
                now - self._arrival,
                len(choice.token_ids),
            )

    def _choice(self, choice: Choice, chat: bool) -> dict[str, Any]:
        logprobs = self._logprobs(choice.token_ids, choice.logprobs, chat)
        entry: dict[str, Any] = {"index": choice.index, "logprobs": logprobs}
        finish_reason = choice.finish_reason
        if chat:
            content, calls = self.tool_parser.parse(choice.text)
            entry["message"] = {"role": "assistant", "content": content}
            if calls:
                entry["message"]["tool_calls"] = [call.as_openai() for call in calls]
                finish_reason = "tool_calls"
        else:
            entry["text"] = choice.text
        entry["finish_reason"] = finish_reason
        return entry

    def _delta_choice(self, index: int, delta: StreamDelta, chat: bool) -> dict[str, Any]:
        logprobs = self._logprobs(delta.token_ids, delta.logprobs or [], chat, index)
        entry: dict[str, Any] = {"index": index, "logprobs": logprobs}
        finish_reason = delta.finish_reason
        if chat:
            entry["delta"] = self._chat_delta(index, delta)
            if delta.finished and self._num_calls[index]:
                finish_reason = "tool_calls"
        else:
            entry["text"] = delta.text or ""
        entry["finish_reason"] = finish_reason
        return entry

    def _chat_delta(self, index: int, delta: StreamDelta) -> dict[str, Any]:
        """A chat chunk's delta: the content the tool stream lets out, and its new calls."""
        stream = self._tool_streams[index]
        fed = stream.feed(delta.text or "")
        content, calls = fed.content or "", fed.calls
        if delta.finished:
            rest = stream.finish()
            content, calls = content + (rest.content or ""), calls + rest.calls
        out: dict[str, Any] = {"content": content}
        if calls:
            first = self._num_calls[index]
            out["tool_calls"] = [c.as_openai(first + i) for i, c in enumerate(calls)]
            self._num_calls[index] += len(calls)
        return out

    def _role(self, index: int) -> dict[str, Any]:
        return {
            "index": index,
            "delta": {"role": "assistant", "content": ""},
            "finish_reason": None,
        }

    def _logprobs(
        self, token_ids: list[int], logprobs: list, chat: bool, streamed: int | None = None
    ) -> dict[str, Any] | None:
        """The logprobs of `token_ids`: a whole choice's, or the next chunk of choice
        `streamed`'s (its text offsets continue from its earlier chunks')."""
        if self.logprobs_k is None:
            return None
        if chat:
            return chat_logprobs(token_ids, logprobs, self.logprobs_k, self.decoder)
        start = 0 if streamed is None else self._text_offsets[streamed]
        built = completion_logprobs(token_ids, logprobs, self.logprobs_k, self.decoder, start)
        if streamed is not None:
            self._text_offsets[streamed] = start + sum(len(piece) for piece in built["tokens"])
        return built

    def _chunk(self, kind: str, choices: list[dict[str, Any]]) -> dict[str, Any]:
        chunk = envelope(kind, self.response_id, self.model_name)
        chunk["choices"] = choices
        return chunk

    def _usage(self) -> dict[str, Any]:
        generated = sum(len(choice.token_ids) for choice in self.choices)
        cached = sum(choice.num_cached_tokens for choice in self.choices[:: self.n])
        return usage(self.prompt_tokens, generated, cached)


def _event(payload: dict[str, Any]) -> str:
    return f"data: {json.dumps(payload)}\n\n"
