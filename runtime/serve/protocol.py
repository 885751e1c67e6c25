"""The OpenAI request bodies the server reads, checked, and what they become: prompts and
`SamplingParams` (pydantic models; FastAPI validates the JSON against them).

Fields follow the OpenAI API (`/v1/completions`, `/v1/chat/completions`) with vLLM's usual
extensions (`top_k`, `min_tokens`, `ignore_eos`, `repetition_penalty`, `stop_token_ids`). A field
the server does not implement is refused when it is set to anything but its neutral value
(`echo`, `best_of`, `logit_bias`, `suffix`, tools): a 400 naming it, never a silent ignore.
Unknown fields are ignored, as OpenAI's own server does.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field
from typing_extensions import TypeIs  # typing's own from Python 3.13

from runtime.core.sampling_params import MAX_LOGPROBS, SamplingParams
from runtime.serve.errors import BadRequest

MAX_N = 16  # most completions one request may ask for
DEFAULT_MAX_TOKENS = 16  # /v1/completions' default, as in OpenAI's API


class StreamOptions(BaseModel):
    include_usage: bool = False


class _Sampling(BaseModel):
    """The sampling fields both endpoints share."""

    model_config = ConfigDict(extra="ignore")

    model: str
    max_tokens: int | None = Field(None, ge=1)  # 0 is refused, as OpenAI's API refuses it
    temperature: float = 1.0
    top_p: float = 1.0
    n: int = Field(1, ge=1, le=MAX_N)
    stream: bool = False
    stream_options: StreamOptions | None = None
    stop: str | list[str] | None = None
    seed: int | None = None
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    logit_bias: dict[str, float] | None = None
    user: str | None = None
    # vLLM's extensions
    top_k: int = 0
    min_tokens: int = 0
    ignore_eos: bool = False
    repetition_penalty: float = 1.0
    stop_token_ids: list[int] | None = None

    def sampling_params(self, max_tokens: int, logprobs: int | None) -> SamplingParams:
        """The `SamplingParams` of one completion (ValueError naming a bad field)."""
        if self.logit_bias:
            raise BadRequest("logit_bias is not supported", "logit_bias")
        return SamplingParams(
            temperature=self.temperature,
            top_k=self.top_k,
            top_p=self.top_p,
            max_tokens=max_tokens,
            min_tokens=self.min_tokens,
            seed=self.seed,
            stop_token_ids=tuple(self.stop_token_ids or ()),
            ignore_eos=self.ignore_eos,
            stop=()
            if self.stop is None
            else (self.stop,)
            if isinstance(self.stop, str)
            else tuple(self.stop),
            logprobs=logprobs,
            presence_penalty=self.presence_penalty,
            frequency_penalty=self.frequency_penalty,
            repetition_penalty=self.repetition_penalty,
        )

    @property
    def include_usage(self) -> bool:
        return self.stream_options is not None and self.stream_options.include_usage


class CompletionRequest(_Sampling):
    """`POST /v1/completions`. `prompt` is one text, one list of token ids, or a list of either
    (each its own choices); `max_tokens` defaults to 16 as in OpenAI's API; `logprobs` k returns
    the k most likely tokens beside each sampled one."""

    prompt: str | list[int] | list[str] | list[list[int]]
    logprobs: int | None = Field(None, ge=0, le=MAX_LOGPROBS)
    echo: bool = False
    best_of: int | None = None
    suffix: str | None = None

    @property
    def answer_tokens(self) -> int:
        """`max_tokens`, 16 when not given."""
        return DEFAULT_MAX_TOKENS if self.max_tokens is None else self.max_tokens

    def prompts(self) -> list[str | list[int]]:
        """The prompts of the request, each a text or a list of token ids."""
        if self.echo:
            raise BadRequest("echo is not supported", "echo")
        if self.best_of not in (None, 1):
            raise BadRequest("best_of is not supported", "best_of")
        if self.suffix:
            raise BadRequest("suffix is not supported", "suffix")
        prompt = self.prompt
        if isinstance(prompt, str) or _is_token_ids(prompt):
            return [prompt]
        if not prompt:
            raise BadRequest("prompt is empty", "prompt")
        return list(prompt)


def _is_token_ids(prompt: list[int] | list[str] | list[list[int]]) -> TypeIs[list[int]]:
    """Whether a list prompt is one prompt's token ids (else a list of prompts)."""
    return bool(prompt) and isinstance(prompt[0], int)


class TextPart(BaseModel):
    type: Literal["text"]
    text: str


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="ignore")

    role: Literal["system", "developer", "user", "assistant"]
    content: str | list[TextPart] | None = None

    def text(self) -> str:
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        return "".join(part.text for part in self.content)


class ChatCompletionRequest(_Sampling):
    """`POST /v1/chat/completions`. The messages are rendered with the checkpoint's chat
    template; `max_completion_tokens` (or the older `max_tokens`) bounds the answer (default: the
    room the context leaves); `logprobs` true with `top_logprobs` k returns log-probabilities."""

    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    logprobs: bool = False
    top_logprobs: int | None = Field(None, ge=0, le=MAX_LOGPROBS)
    tools: list[Any] | None = None
    tool_choice: Any = None
    response_format: dict[str, Any] | None = None

    def conversation(self) -> list[dict[str, str]]:
        """The messages as the chat template reads them ({"role", "content"} dicts)."""
        if self.tools:
            raise BadRequest("tools are not supported", "tools")
        if self.response_format and self.response_format.get("type", "text") != "text":
            raise BadRequest("response_format other than text is not supported", "response_format")
        return [{"role": m.role, "content": m.text()} for m in self.messages]

    @property
    def logprobs_k(self) -> int | None:
        """The `SamplingParams.logprobs` the request asks for (None: none)."""
        if not self.logprobs:
            if self.top_logprobs:
                raise BadRequest("top_logprobs needs logprobs: true", "top_logprobs")
            return None
        return self.top_logprobs or 0

    @property
    def answer_tokens(self) -> int | None:
        """`max_completion_tokens`, else `max_tokens`; None: the room the context leaves."""
        return (
            self.max_completion_tokens
            if self.max_completion_tokens is not None
            else self.max_tokens
        )
