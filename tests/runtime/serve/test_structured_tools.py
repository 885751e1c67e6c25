"""Structured outputs and tool calls as users reach them: the unmodified `openai` client
against a live `jmamba serve` (tiny-stdlib: its text is noise, so only the grammar makes an
answer valid) with ngram drafts in small steps (larger ones run without drafts) and Hermes
tool calls. Every constrained answer parses and validates, greedy and sampled; a forced call
comes back as `tool_calls`, whole and streamed; bad specs get OpenAI-shaped 400s."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator

import httpx
import jsonschema
import openai
import pytest

from tests.runtime.serve.live import ready_server

MODEL = "tiny-stdlib"
OPTIONS = [
    *("--model", MODEL, "--max-num-seqs", "4", "--max-model-len", "768"),
    *("--prefix-caching", "off", "--warmup", "alone", "--tool-call-parser", "hermes"),
    *("--speculative-method", "ngram", "--speculative-max-batch-size", "2"),
    "--one-sampler-program",
]
SCHEMA = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "maxLength": 12},
        "days": {"type": "integer", "minimum": 1, "maximum": 14},
        "metric": {"type": "boolean"},
    },
    "required": ["city", "days", "metric"],
    "additionalProperties": False,
}
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The forecast for a city",
        "parameters": SCHEMA,
    },
}
MESSAGES = [{"role": "user", "content": "What is the weather in Paris this week?"}]


@pytest.fixture(scope="module")
def server() -> Iterator[str]:
    with ready_server(OPTIONS) as live:
        yield live.base


@pytest.fixture(scope="module")
def client(server: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{server}/v1", api_key="unused", timeout=120, max_retries=0)


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_json_schema_and_json_object_answers_validate(client: openai.OpenAI, temperature: float):
    schema_format = {"type": "json_schema", "json_schema": {"name": "forecast", "schema": SCHEMA}}
    answer = client.chat.completions.create(
        model=MODEL,
        messages=MESSAGES,
        max_tokens=80,
        temperature=temperature,
        seed=3,
        n=2,
        response_format=schema_format,
    )
    for choice in answer.choices:
        assert choice.finish_reason == "stop"
        jsonschema.validate(json.loads(choice.message.content), SCHEMA)
    done = client.completions.create(
        model=MODEL,
        prompt='{"a": 1} {"a": 2} {"',
        max_tokens=80,
        temperature=temperature,
        extra_body={"response_format": {"type": "json_object"}},  # vLLM's: on completions too
    )
    assert isinstance(json.loads(done.choices[0].text), dict), done.choices[0].text


def test_regex_and_choice_through_structured_outputs(client: openai.OpenAI):
    regex = r"[a-z]{2,8}@[a-z]{2,6}\.(com|org)"
    mail = client.completions.create(
        model=MODEL,
        prompt="ann@site.org bob@",
        max_tokens=40,
        temperature=0.0,
        extra_body={"structured_outputs": {"regex": regex}},
    )
    assert re.fullmatch(regex, mail.choices[0].text), mail.choices[0].text
    stream = client.chat.completions.create(
        model=MODEL,
        messages=MESSAGES,
        max_tokens=20,
        temperature=1.0,
        stream=True,
        extra_body={"structured_outputs": {"choice": ["sunny", "cloudy", "rain"]}},
    )
    assert "".join(c.choices[0].delta.content or "" for c in stream) in {"sunny", "cloudy", "rain"}


@pytest.mark.parametrize("stream", [False, True])
def test_a_forced_tool_call_comes_back_as_tool_calls(client: openai.OpenAI, stream: bool):
    """tool_choice naming the function constrains the answer to a Hermes block, parsed."""
    options = dict(
        model=MODEL,
        messages=MESSAGES,
        tools=[WEATHER],
        tool_choice={"type": "function", "function": {"name": "get_weather"}},
        max_tokens=120,
        temperature=0.0,
    )
    if stream:
        chunks = list(client.chat.completions.create(**options, stream=True))
        calls = [call for c in chunks for call in c.choices[0].delta.tool_calls or []]
        finish = chunks[-1].choices[0].finish_reason
        content = "".join(c.choices[0].delta.content or "" for c in chunks)
        name, arguments = calls[0].function.name, calls[0].function.arguments
        assert [call.index for call in calls] == [0] and content == ""
    else:
        answer = client.chat.completions.create(**options)
        (call,) = answer.choices[0].message.tool_calls
        finish, content = answer.choices[0].finish_reason, answer.choices[0].message.content
        name, arguments = call.function.name, call.function.arguments
        assert content is None and call.type == "function" and call.id.startswith("call_")
    assert finish == "tool_calls" and name == "get_weather"
    jsonschema.validate(json.loads(arguments), SCHEMA)


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"structured_outputs": {"regex": "a("}}, "structured_outputs"),
        ({"structured_outputs": {"pattern": "a"}}, "structured_outputs"),
        ({"response_format": {"type": "json_schema", "json_schema": {}}}, "response_format"),
        ({"response_format": {"type": "yaml"}}, "response_format"),
        ({"guided_regex": "a+"}, "guided_regex"),
        ({"tools": [WEATHER], "tool_choice": {"function": {"name": "nope"}}}, "tool_choice"),
    ],
)
def test_bad_constraints_get_openai_400s(server: str, body: dict, param: str):
    payload = {"model": MODEL, "messages": MESSAGES, "max_tokens": 4, **body}
    reply = httpx.post(f"{server}/v1/chat/completions", json=payload, timeout=60)
    assert reply.status_code == 400, reply.text
    error = reply.json()["error"]
    assert error["param"] == param and error["type"] == "invalid_request_error"
