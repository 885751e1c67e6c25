"""`Intake`: the server's one front door, from a checked body to a `Completion` in flight.

A request's choices are counted against the limits first (`limits.py`: prompts x n, then room in
the queue), on the event loop, where that costs nothing. What can take long runs in a worker
thread: rendering the chat template (with the tools a chat request offers), and tokenizing
(through `encode_batch`, which releases the GIL while it works: `encode` holds it, and a 5 MB
prompt would stall every client for seconds).
Then the choices go to the engine thread, whose `Engine.add_request` is the one check a request
meets (`AsyncEngine.add`: all or none). No handler reaches into the engine.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import dataclasses
import itertools
from collections.abc import Callable, Iterator
from typing import Any

from runtime.core.sampling_params import SamplingParams
from runtime.llm import LLM
from runtime.serve.async_engine import AsyncEngine, Job
from runtime.serve.errors import BadRequest
from runtime.serve.limits import Limits, check_prompt_tokens
from runtime.serve.metrics import Metrics
from runtime.serve.protocol import ChatCompletionRequest, CompletionRequest
from runtime.serve.responses import Decoder
from runtime.serve.streams import Completion
from runtime.serve.tool_parsers import NoToolParser, ToolParser

WORKERS = 4  # threads that render and tokenize; tokenizing runs without the GIL


class Intake:
    """Turns checked bodies into requests in flight for one model (see the module docstring)."""

    def __init__(
        self,
        llm: LLM,
        engine: AsyncEngine,
        limits: Limits,
        metrics: Metrics,
        model_name: str,
        tool_parser: ToolParser | None = None,
    ) -> None:
        """`tool_parser` reads chat answers for tool calls (None: `NoToolParser`)."""
        self.llm, self.engine, self.limits = llm, engine, limits
        self.tool_parser = tool_parser or NoToolParser()
        self.metrics, self.model_name = metrics, model_name
        self.max_model_len = llm.engine.config.max_model_len
        # the most requests the engine steps at once, over its data-parallel ranks
        self.running = llm.engine.config.max_num_seqs * len(llm.engine.ranks)
        self.decoder = Decoder(llm.tokenizer)
        self._workers = concurrent.futures.ThreadPoolExecutor(
            WORKERS, thread_name_prefix="jmamba-intake"
        )
        self._preparing = 0  # choices admitted and not yet handed to the engine
        self._ids = itertools.count()

    async def completion(self, body: CompletionRequest) -> Completion:
        """`/v1/completions`: the request's prompts x n choices, started."""
        prompts = body.prompts()
        with self._admitted(len(prompts), body.n):
            ids = await self._off_loop(self._encode_all, prompts)
            params = body.sampling_params(body.answer_tokens, body.logprobs, body.structured())
            return await self._start("cmpl", ids, params, body.n, body.include_usage)

    async def chat(self, body: ChatCompletionRequest) -> Completion:
        """`/v1/chat/completions`: the rendered conversation's n choices, started."""
        logprobs, structured = body.logprobs_k, body.constraint(self.tool_parser)
        parser = self.tool_parser if body.calls_tools() else NoToolParser()
        with self._admitted(1, body.n):
            prompt = await self._off_loop(self._render, body)
            answer = body.answer_tokens
            if answer is None:  # the room the context leaves (the engine refuses no room)
                answer = max(self.max_model_len - len(prompt), 1)
            params = body.sampling_params(answer, logprobs, structured)
            usage = body.include_usage
            return await self._start("chatcmpl", [prompt], params, body.n, usage, parser)

    def close(self) -> None:
        """Let the worker threads go (a render or tokenization under way finishes alone)."""
        self._workers.shutdown(wait=False, cancel_futures=True)

    @contextlib.contextmanager
    def _admitted(self, num_prompts: int, n: int) -> Iterator[None]:
        """Hold room for the choices while they are prepared (400 / 503 when there is none)."""
        self.limits.check_choices(num_prompts, n)
        choices = num_prompts * n
        self.limits.check_room(self.engine.num_live + self._preparing, choices, self.running)
        self._preparing += choices
        try:
            yield
        finally:  # handed to the engine (counted live there) or refused
            self._preparing -= choices

    async def _off_loop[T](self, work: Callable[[Any], T], argument: Any) -> T:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._workers, work, argument)

    def _encode_all(self, prompts: list[str | list[int]]) -> list[list[int]]:
        """(worker thread) Each prompt as token ids."""
        return [self._encode(prompt, "prompt") for prompt in prompts]

    def _render(self, body: ChatCompletionRequest) -> list[int]:
        """(worker thread) The conversation and its tools through the chat template, as token
        ids."""
        template = self.llm.require_chat_template()
        text = template.render(body.conversation(), add_generation_prompt=True, tools=body.tools)
        return self._encode(text, "messages")

    def _encode(self, prompt: str | list[int], param: str) -> list[int]:
        if isinstance(prompt, list):
            check_prompt_tokens(len(prompt), self.max_model_len, param)
            return prompt
        tokenizer = self.llm.tokenizer
        if tokenizer is None:
            raise BadRequest("text prompts need a tokenizer: send token ids", param)
        _check_unicode(prompt, param)
        encoding = tokenizer.encode_batch([prompt])[0]  # without the GIL, unlike encode()
        check_prompt_tokens(len(encoding), self.max_model_len, param)  # before the ids' list
        return encoding.ids

    async def _start(
        self,
        kind: str,
        prompts: list[list[int]],
        params: SamplingParams,
        n: int,
        include_usage: bool,
        tool_parser: ToolParser | None = None,
    ) -> Completion:
        """Hand every (prompt, choice) to the engine (all or none) and follow their streams."""
        jobs: list[Job] = [(p, _with_seed(params, i)) for p in prompts for i in range(n)]
        streams = await self.engine.add(jobs)
        prompt_tokens = sum(len(prompt) for prompt in prompts)
        self.metrics.prompt_tokens.inc(prompt_tokens * n)
        return Completion(
            f"{kind}-{next(self._ids)}",
            self.model_name,
            streams,
            prompt_tokens,
            include_usage,
            params.logprobs,
            self.metrics,
            self.decoder,
            tool_parser or NoToolParser(),
            n,
        )


def _check_unicode(text: str, param: str) -> None:
    """400 for a text JSON can carry but no tokenizer can read (a lone surrogate, "\\ud800")."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as error:
        raise BadRequest(
            f"{param} is not valid Unicode: a lone surrogate at character {error.start}", param
        ) from None


def _with_seed(params: SamplingParams, choice: int) -> SamplingParams:
    """Choice i of a seeded request samples with seed + i (distinct, reproducible choices)."""
    if params.seed is None or choice == 0:
        return params
    return dataclasses.replace(params, seed=(params.seed + choice) % 2**32)
