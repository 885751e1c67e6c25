"""Tool-call parsers on literal answers: Hermes blocks become calls and the text around them
content; a stream cut anywhere gives the same calls as the whole answer; what is not a call
stays text; the CLI names exactly the parsers there are."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from runtime.cli.serve import TOOL_CALL_PARSERS
from runtime.serve.errors import BadRequest
from runtime.serve.tool_parsers import (
    TOOL_PARSERS,
    HermesToolParser,
    NoToolParser,
    ToolCall,
    tool_parser,
)

CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
WEATHER = ToolCall("get_weather", '{"city": "Paris"}')
TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {}}}]


@pytest.mark.parametrize(
    ("text", "content", "calls"),
    [
        (CALL, None, [WEATHER]),
        (f"Let me look.\n{CALL}", "Let me look.", [WEATHER]),
        (f"{CALL}\n{CALL}", None, [WEATHER, WEATHER]),
        ("no call here", "no call here", []),
        ("<tool_call>not json</tool_call>", "<tool_call>not json</tool_call>", []),
        (
            '<tool_call>{"arguments": {}}</tool_call>',
            '<tool_call>{"arguments": {}}</tool_call>',
            [],
        ),
        (CALL.removesuffix("\n</tool_call>"), None, [WEATHER]),  # cut short, its JSON whole
        ('say <tool_call>{"name": "get_w', 'say <tool_call>{"name": "get_w', []),
    ],
)
def test_hermes_parses_whole_answers(text: str, content: str | None, calls: list[ToolCall]):
    assert HermesToolParser().parse(text) == (content, calls)


def streamed(text: str, cuts: list[int]) -> tuple[str, list[ToolCall]]:
    """`text` fed to a Hermes stream in pieces cut at `cuts`: (content, calls)."""
    stream = HermesToolParser().stream()
    bounds = [0, *sorted(cuts), len(text)]
    parts = [stream.feed(text[a:b]) for a, b in zip(bounds, bounds[1:], strict=False)]
    parts.append(stream.finish())
    return "".join(p.content or "" for p in parts), [c for p in parts for c in p.calls]


@settings(max_examples=40, deadline=None)
@given(cuts=st.lists(st.integers(0, len(CALL) * 2 + 10), max_size=8))
def test_a_stream_cut_anywhere_gives_the_whole_answers_calls(cuts: list[int]):
    text = f"ok <tool{CALL} then {CALL}"
    content, calls = streamed(text, [c for c in cuts if c <= len(text)])
    assert calls == [WEATHER, WEATHER]
    assert content == "ok <tool then "


def test_a_stream_cut_inside_a_block_keeps_a_whole_call():
    """max_tokens ending a block before its closing tag: a call if its JSON is whole."""
    assert streamed(CALL.removesuffix("\n</tool_call>"), [5])[1] == [WEATHER]
    assert streamed('<tool_call>{"name": "get_w', []) == ('<tool_call>{"name": "get_w', [])


def test_forced_grammars_name_the_tools():
    """A named function or "required" forces a call; "auto" forces nothing."""
    parser = HermesToolParser()
    named = parser.forced(TOOLS, {"type": "function", "function": {"name": "get_weather"}})
    assert named is not None and named.grammar is not None and "get_weather" in named.grammar
    assert parser.forced(TOOLS, "required") is not None
    assert parser.forced(TOOLS, "auto") is None
    with pytest.raises(BadRequest, match="not among the tools"):
        parser.forced(TOOLS, {"type": "function", "function": {"name": "other"}})


def test_no_parser_reads_content_and_refuses_tools():
    assert NoToolParser().parse(CALL) == (CALL, [])
    with pytest.raises(BadRequest, match="--tool-call-parser"):
        NoToolParser().forced(TOOLS, "auto")


def test_the_cli_names_every_parser():
    assert sorted(TOOL_CALL_PARSERS) == sorted(TOOL_PARSERS)
    assert tool_parser("hermes").name == "hermes"
    with pytest.raises(ValueError, match="unknown"):
        tool_parser("mistral")


def test_a_call_as_openai_carries_json_arguments():
    entry = WEATHER.as_openai(index=2)
    assert entry["index"] == 2 and entry["type"] == "function"
    assert json.loads(entry["function"]["arguments"]) == {"city": "Paris"}
