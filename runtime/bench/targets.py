"""Where a benchmark's requests go, and what each one cost.

`HttpTarget` streams `/v1/completions` from a running `jmamba serve` (greedy, `ignore_eos` so
answers have the asked length, usage in the last chunk); `EngineTarget` runs the same requests
on an engine thread in this process (no HTTP: the server's own overhead is the difference).
Time to first token is taken when the first chunk of generated tokens arrives, whether or not
its text is empty (a byte-level tokenizer holds back an incomplete UTF-8 character, and a
model's special tokens have no text).
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import time
from typing import Any, Protocol

from runtime.core.sampling_params import SamplingParams


@dataclasses.dataclass(frozen=True)
class Record:
    """One request: seconds from its start to its first token and to its end, tokens in and
    out, and the answer text (a chat's next turn holds it)."""

    start: float
    ttft: float
    latency: float
    prompt_tokens: int
    output_tokens: int
    text: str


class Target(Protocol):
    async def complete(self, prompt: str, max_tokens: int) -> Record: ...

    async def compile_seconds(self) -> float:
        """Seconds the serving engine has spent compiling so far."""

    async def close(self) -> None: ...


class HttpTarget:
    """A running server at `url` (e.g. http://localhost:8000)."""

    def __init__(self, url: str, timeout: float = 600.0) -> None:
        import httpx  # the serve extra

        self.url = url.rstrip("/")
        self.client = httpx.AsyncClient(timeout=timeout)
        self.model: str | None = None

    async def complete(self, prompt: str, max_tokens: int) -> Record:
        if self.model is None:
            models = (await self.client.get(f"{self.url}/v1/models")).json()
            self.model = models["data"][0]["id"]
        body = {
            "model": self.model,
            "prompt": prompt,
            "max_tokens": max_tokens,
            "temperature": 0,
            "ignore_eos": True,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        start = time.perf_counter()
        first: float | None = None
        text = ""
        usage: dict[str, Any] = {}  # the last chunk's (JSON)
        async with self.client.stream("POST", f"{self.url}/v1/completions", json=body) as reply:
            if reply.status_code != 200:
                raise RuntimeError(
                    f"the server answered {reply.status_code}: {await reply.aread()!r}"
                )
            async for chunk in _events(reply):
                for choice in chunk.get("choices", []):
                    if first is None:  # the server streams a chunk per step with new tokens
                        first = time.perf_counter()
                    text += choice.get("text", "")
                usage = chunk.get("usage") or usage
        end = time.perf_counter()
        return Record(
            start,
            (first or end) - start,
            end - start,
            int(usage.get("prompt_tokens", 0)),
            int(usage.get("completion_tokens", 0)),
            text,
        )

    async def compile_seconds(self) -> float:
        text = (await self.client.get(f"{self.url}/metrics")).text
        for line in text.splitlines():
            if line.startswith("jmamba_compile_seconds_total "):
                return float(line.split()[1])
        return 0.0

    async def close(self) -> None:
        await self.client.aclose()


async def _events(reply: Any) -> Any:
    """The JSON payloads of a server-sent event stream, until `[DONE]`."""
    async for line in reply.aiter_lines():
        if not line.startswith("data: "):
            continue
        payload = line.removeprefix("data: ")
        if payload == "[DONE]":
            return
        yield json.loads(payload)


class EngineTarget:
    """An engine thread in this process over `llm` (an `LLM`); start it with `start()`."""

    def __init__(self, llm: Any) -> None:
        from runtime.serve.async_engine import AsyncEngine

        self.llm = llm
        self.engine = AsyncEngine(llm.engine)

    def start(self) -> None:
        self.engine.start(asyncio.get_running_loop())

    async def complete(self, prompt: str, max_tokens: int) -> Record:
        tokens = self.llm.tokenizer.encode(prompt).ids
        params = SamplingParams(max_tokens=max_tokens, ignore_eos=True)
        self.llm.engine.check_request(tokens, params)
        start = time.perf_counter()
        first, text, generated = None, "", 0
        _, deltas = self.engine.submit(tokens, params)
        async for delta in deltas:
            if delta.token_ids and first is None:
                first = time.perf_counter()
            text += delta.text or ""
            generated += len(delta.token_ids)
        end = time.perf_counter()
        return Record(start, (first or end) - start, end - start, len(tokens), generated, text)

    async def compile_seconds(self) -> float:
        return self.llm.engine.total_compile_seconds

    async def close(self) -> None:
        self.engine.stop()
