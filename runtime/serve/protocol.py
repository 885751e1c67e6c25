"""The OpenAI request bodies the server reads, checked, and what they become: prompts and
`SamplingParams` (pydantic models; FastAPI validates the JSON against them).

Fields follow the OpenAI API (`/v1/completions`, `/v1/chat/completions`) with vLLM's usual
extensions (`top_k`, `min_tokens`, `ignore_eos`, `repetition_penalty`, `stop_token_ids`, and
`structured_outputs`: `response_format.py`). Chat requests may offer `tools` (rendered by the
chat template) and a `tool_choice` (`tool_parsers.py`). A field the server does not implement is
refused when it is set to anything but its neutral value (`echo`, `best_of`, `logit_bias`,
`suffix`, vLLM's older `guided_*`): a 400 naming it, never a silent ignore. Unknown fields are
ignored, as OpenAI's own server does.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field
from typing_extensions import TypeIs  # typing's own from Python 3.13

from runtime.core.sampling_params import MAX_LOGPROBS, SamplingParams
from runtime.core.structured_output import StructuredOutput
from runtime.serve.errors import BadRequest
from runtime.serve.response_format import structured_output
from runtime.serve.tool_parsers import ToolParser

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
    structured_outputs: dict[str, Any] | None = None
    guided_json: Any = None
    guided_regex: Any = None
    guided_choice: Any = None
    guided_grammar: Any = None
    # OpenAI's
    response_format: dict[str, Any] | None = None

    def structured(self) -> StructuredOutput | None:
        """What the answer must match (`response_format` or `structured_outputs`)."""
        legacy = {
            "guided_json": self.guided_json,
            "guided_regex": self.guided_regex,
            "guided_choice": self.guided_choice,
            "guided_grammar": self.guided_grammar,
        }
        return structured_output(self.response_format, self.structured_outputs, legacy)

    def sampling_params(
        self, max_tokens: int, logprobs: int | None, structured: StructuredOutput | None = None
    ) -> SamplingParams:
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
            structured=structured,
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
    """A message; an assistant's may carry its `tool_calls`, a "tool" one answers the call
    `tool_call_id` (both handed to the chat template as they came)."""

    model_config = ConfigDict(extra="ignore")

    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[TextPart] | None = None
    tool_calls: list[dict[str, Any]] | None = None
    tool_call_id: str | None = None
    name: str | None = None

    def for_template(self) -> dict[str, Any]:
        """The message as the chat template reads it: role and text content, and the tool
        fields that are set."""
        message: dict[str, Any] = {"role": self.role, "content": self.text()}
        extra = {"tool_calls": self.tool_calls, "tool_call_id": self.tool_call_id}
        return message | {
            key: value for key, value in (extra | {"name": self.name}).items() if value
        }

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
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] | None = None

    def conversation(self) -> list[dict[str, Any]]:
        """The messages as the chat template reads them (`ChatMessage.for_template`)."""
        return [m.for_template() for m in self.messages]

    def calls_tools(self) -> bool:
        """Whether the answer is read for tool calls: tools offered, tool_choice not "none"."""
        return bool(self.tools) and self.tool_choice != "none"

    def constraint(self, parser: ToolParser) -> StructuredOutput | None:
        """What the answer must match: a call in the parser's format when tool_choice forces
        one (`ToolParser.forced`), else `structured()`; a 400 for both at once."""
        structured = self.structured()
        if not self.calls_tools() or self.tools is None:
            return structured
        if self.tool_choice not in (None, "auto", "required") and not isinstance(
            self.tool_choice, dict
        ):
            raise BadRequest(f"tool_choice={self.tool_choice!r} is not supported", "tool_choice")
        forced = parser.forced(self.tools, self.tool_choice)
        if forced is not None and structured is not None:
            raise BadRequest("a forced tool call and a response format at once", "tool_choice")
        return forced or structured

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
