"""`ForwardedRequest`: one HTTP request as the ingress hands it to a replica, with the text the
prefix-affinity router matches (`prompt`).

Ray Serve's `PrefixCacheAffinityRouter` reads the first positional argument of a handle call that
has a `prompt` (or `messages`) attribute, as Ray Serve LLM's ingress passes its parsed OpenAI
request; this object is that argument. Its `prompt` is the request's routing text, made from the
raw JSON body without validating it (the replica's app does that, once): a completion's prompt
(token ids as "id," each, so that a prefix of tokens is a prefix of the text), or a chat's
messages, role and content, in order (a conversation that grows by appending messages keeps its
earlier text as a prefix). The text is capped at `ROUTING_CHARS`: two prompts that agree that far
go to the same replica anyway, and the router's prefix tree holds every routed text.

jax-free and Ray-free: plain data that pickles between the ingress and replica processes.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any

ROUTING_CHARS = 4096  # the longest routing text kept (see the module docstring)
PROMPT_PATHS = ("/v1/completions", "/v1/chat/completions")  # the routes routed by prefix


@dataclasses.dataclass(frozen=True)
class ForwardedRequest:
    """An HTTP request for the replica's app: method, path, query string, headers (latin-1
    pairs, as ASGI carries them), body, and `prompt`, the text the router matches ("" when
    the request has none: such requests are routed by load alone)."""

    method: str
    path: str
    query: bytes
    headers: list[tuple[bytes, bytes]]
    body: bytes
    prompt: str = ""


@dataclasses.dataclass(frozen=True)
class ResponseStart:
    """The first part of a replica's answer: status and headers; body chunks (bytes) follow."""

    status: int
    headers: list[tuple[bytes, bytes]]


def routing_text(path: str, body: bytes) -> str:
    """The text the router matches for a request to `path` with `body` ("" if none)."""
    if path not in PROMPT_PATHS:
        return ""
    try:
        request = json.loads(body)
    except (ValueError, UnicodeDecodeError):
        return ""  # the replica answers the 400
    if not isinstance(request, dict):
        return ""
    if path == "/v1/completions":
        text = _prompt_text(request.get("prompt"))
    else:
        text = _messages_text(request.get("messages"))
    return text[:ROUTING_CHARS]


def _prompt_text(prompt: Any) -> str:
    """A completion's prompt as text: a string, token ids, or the first of a batch."""
    if isinstance(prompt, str):
        return prompt
    if isinstance(prompt, list) and prompt:
        first = prompt[0]
        if isinstance(first, int):
            return "".join(f"{token}," for token in prompt)
        return _prompt_text(first)
    return ""


def _messages_text(messages: Any) -> str:
    """A chat's messages as text: each one's role and content, in order."""
    if not isinstance(messages, list):
        return ""
    pieces = []
    for message in messages:
        if isinstance(message, dict):
            pieces.append(f"{message.get('role', '')}:{_content_text(message.get('content'))}\n")
    return "".join(pieces)


def _content_text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        texts = (part.get("text") for part in content if isinstance(part, dict))
        return "".join(text for text in texts if isinstance(text, str))
    return ""
