"""Tool calls: the model's tool-call format parsed into OpenAI `tool_calls`, whole or streamed.

A parser (`--tool-call-parser`) is a `ToolParser`. `NoToolParser`, when none is chosen, reads
every answer as content (and a request offering tools is refused unless its tool_choice is
"none"). `HermesToolParser` reads the `<tool_call>{"name": ..., "arguments": {...}}</tool_call>`
blocks Qwen's chat templates teach (Hermes' format); the text around them is the content.
A request whose tool_choice forces a call ("required", or {"type": "function", "function":
{"name": ...}}) has its answer constrained to the parser's format (`forced`: a grammar whose
call is JSON valid against the tools' parameters), so a call comes out whatever the model.
"""

from __future__ import annotations

import json
import re
import uuid
from typing import Any, NamedTuple, Protocol

from runtime.core.structured_output import StructuredOutput
from runtime.serve.errors import BadRequest

OPEN, CLOSE = "<tool_call>", "</tool_call>"
_BLOCK = re.compile(re.escape(OPEN) + r"(.*?)" + re.escape(CLOSE), re.DOTALL)


class ToolCall(NamedTuple):
    """One parsed call: the function's name and its arguments as JSON text."""

    name: str
    arguments: str

    def as_openai(self, index: int | None = None) -> dict[str, Any]:
        """The call as a message's `tool_calls` entry (with `index`: a streamed delta's)."""
        entry: dict[str, Any] = {"id": f"call_{uuid.uuid4().hex[:24]}", "type": "function"}
        entry["function"] = {"name": self.name, "arguments": self.arguments}
        return entry if index is None else {"index": index, **entry}


class Parsed(NamedTuple):
    """An answer read by a parser: its content (None: none) and its calls."""

    content: str | None
    calls: list[ToolCall]


class ToolStream(Protocol):
    """One streamed choice's reader: text in, content and whole calls out as they complete."""

    def feed(self, text: str) -> Parsed:
        """The content to send now and the calls completed by `text`."""
        ...

    def finish(self) -> Parsed:
        """What is left once the answer has ended."""
        ...


class ToolParser(Protocol):
    """A model family's tool-call format (module docstring)."""

    name: str

    def parse(self, text: str) -> Parsed:
        """A whole answer's content and calls."""
        ...

    def stream(self) -> ToolStream:
        """A reader for one streamed answer."""
        ...

    def forced(self, tools: list[dict[str, Any]], tool_choice: Any) -> StructuredOutput | None:
        """The constraint that makes the answer a call when `tool_choice` demands one."""
        ...


class _PassThrough:
    """A stream read as content alone."""

    def feed(self, text: str) -> Parsed:
        return Parsed(text, [])

    def finish(self) -> Parsed:
        return Parsed("", [])


class NoToolParser:
    """No tool-call format: the answer is content (the seam when no parser is chosen)."""

    name = "none"

    def parse(self, text: str) -> Parsed:
        return Parsed(text, [])

    def stream(self) -> ToolStream:
        return _PassThrough()

    def forced(self, tools: list[dict[str, Any]], tool_choice: Any) -> StructuredOutput | None:
        raise BadRequest("tools need a tool-call parser: serve with --tool-call-parser", "tools")


class HermesToolParser:
    """`<tool_call>{json}</tool_call>` blocks (Qwen2.5 / Qwen3 / Qwen3.5, Hermes)."""

    name = "hermes"

    def parse(self, text: str) -> Parsed:
        calls, content, at = [], [], 0
        for block in _BLOCK.finditer(text):
            call = _call(block.group(1))
            if call is not None:
                calls.append(call)
                content.append(text[at : block.start()])
                at = block.end()
        tail = text[at:]
        opened = tail.find(OPEN)  # a block cut short (max_tokens): a call if its JSON is whole
        cut = None if opened < 0 else _call(tail[opened + len(OPEN) :])
        if cut is not None:
            calls.append(cut)
            tail = tail[:opened]
        content.append(tail)
        rest = "".join(content).strip()
        return Parsed(rest or None, calls) if calls else Parsed(text, [])

    def stream(self) -> ToolStream:
        return _HermesStream()

    def forced(self, tools: list[dict[str, Any]], tool_choice: Any) -> StructuredOutput | None:
        schemas = [_call_schema(tool) for tool in _forced_tools(tools, tool_choice)]
        if not schemas:
            return None
        schema: dict[str, Any] = schemas[0] if len(schemas) == 1 else {"anyOf": schemas}
        schema["x-guidance"] = {"whitespace_flexible": False}
        call = f"call: %json {json.dumps(schema)}"
        return StructuredOutput(grammar=f'start: "{OPEN}\\n" call "\\n{CLOSE}"\n{call}')


class _HermesStream:
    """Streamed hermes blocks: text outside them goes out as it comes (but for a tail that may
    open one), each block once it has closed."""

    def __init__(self) -> None:
        self._buffer = ""
        self._in_call = False

    def feed(self, text: str) -> Parsed:
        self._buffer += text
        content, calls = [], []
        while True:
            if self._in_call:
                end = self._buffer.find(CLOSE)
                if end < 0:
                    break
                block, self._buffer = self._buffer[:end], self._buffer[end + len(CLOSE) :]
                self._in_call = False
                call = _call(block)
                if call is None:
                    content.append(OPEN + block + CLOSE)
                else:
                    calls.append(call)
                continue
            start = self._buffer.find(OPEN)
            if start < 0:
                keep = _partial_open(self._buffer)
                content.append(self._buffer[: len(self._buffer) - keep])
                self._buffer = self._buffer[len(self._buffer) - keep :]
                break
            content.append(self._buffer[:start])
            self._buffer, self._in_call = self._buffer[start + len(OPEN) :], True
        return Parsed("".join(content), calls)

    def finish(self) -> Parsed:
        rest, self._buffer = self._buffer, ""
        if not self._in_call:
            return Parsed(rest, [])
        call = _call(rest)  # a block cut short (max_tokens): a call if its JSON is whole
        return Parsed("", [call]) if call is not None else Parsed(OPEN + rest, [])


TOOL_PARSERS: dict[str, type[NoToolParser] | type[HermesToolParser]] = {
    "none": NoToolParser,
    "hermes": HermesToolParser,
}


def tool_parser(name: str) -> ToolParser:
    """The parser named `name` (a key of `TOOL_PARSERS`); ValueError naming the known ones."""
    if name not in TOOL_PARSERS:
        raise ValueError(f"tool-call parser {name!r} is unknown: one of {sorted(TOOL_PARSERS)}")
    return TOOL_PARSERS[name]()


def _call(block: str) -> ToolCall | None:
    """A block's call, or None unless it is {"name": str, "arguments": ...} JSON."""
    try:
        value = json.loads(block)
    except json.JSONDecodeError:
        return None
    if not isinstance(value, dict) or not isinstance(value.get("name"), str):
        return None
    return ToolCall(value["name"], json.dumps(value.get("arguments", {})))


def _partial_open(text: str) -> int:
    """The length of the longest tail of `text` that begins `OPEN` (held back: it may open one)."""
    for size in range(min(len(text), len(OPEN) - 1), 0, -1):
        if OPEN.startswith(text[-size:]):
            return size
    return 0


def _forced_tools(tools: list[dict[str, Any]], tool_choice: Any) -> list[dict[str, Any]]:
    """The tools a call must be one of: all for "required", the named one, none otherwise."""
    if tool_choice == "required":
        return tools
    if not isinstance(tool_choice, dict):
        return []
    name = (tool_choice.get("function") or {}).get("name")
    named = [tool for tool in tools if _function(tool).get("name") == name]
    if not named:
        raise BadRequest(f"tool_choice names {name!r}, which is not among the tools", "tool_choice")
    return named


def _call_schema(tool: dict[str, Any]) -> dict[str, Any]:
    """The JSON schema of one call of `tool`: its name, and arguments valid for its parameters."""
    function = _function(tool)
    return {
        "type": "object",
        "properties": {
            "name": {"const": function.get("name")},
            "arguments": function.get("parameters") or {"type": "object"},
        },
        "required": ["name", "arguments"],
        "additionalProperties": False,
    }


def _function(tool: dict[str, Any]) -> dict[str, Any]:
    function = tool.get("function") if isinstance(tool, dict) else None
    return function if isinstance(function, dict) else {}
