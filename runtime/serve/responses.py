"""OpenAI response objects built from a request's deltas: a whole completion or chat completion,
the server-sent chunks of a streamed one, and the log-probabilities in each endpoint's format."""

from __future__ import annotations

import time
from typing import Any

from runtime.outputs.request_output import StreamDelta

Logprobs = dict[int, float]  # one token's {token id: log-probability}, sampled token first


class Choice:
    """One completion of a request (choice `index`), accumulated from its deltas."""

    def __init__(self, index: int) -> None:
        self.index = index
        self.text = ""
        self.token_ids: list[int] = []
        self.logprobs: list[Logprobs] = []
        self.finish_reason: str | None = None
        self.num_cached_tokens = 0  # prompt tokens the prefix cache gave it (once finished)

    def add(self, delta: StreamDelta) -> None:
        self.text += delta.text or ""
        self.token_ids += delta.token_ids
        self.logprobs += delta.logprobs or []
        if delta.output is not None:
            self.finish_reason = delta.output.finish_reason
            self.num_cached_tokens = delta.output.num_cached_tokens


class Decoder:
    """Token text for log-probabilities (the tokenizer's piece of one token id), each piece
    decoded once per server (a dict bounded by the vocabulary; safe to share between threads)."""

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        self._pieces: dict[int, str] = {}

    def piece(self, token: int) -> str:
        piece = self._pieces.get(token)
        if piece is None:
            piece = self._decode(token)
            self._pieces[token] = piece
        return piece

    def _decode(self, token: int) -> str:
        if self.tokenizer is None:
            return str(token)
        return self.tokenizer.decode([token], skip_special_tokens=False)


def completion_logprobs(
    token_ids: list[int], logprobs: list[Logprobs], k: int, decoder: Decoder, start: int = 0
) -> dict[str, Any]:
    """`/v1/completions` logprobs: tokens, their log-probabilities, each position's top k, and
    each token's offset into the completion's text (`start` for the first: a streamed chunk's
    continue from the pieces of the chunks before it)."""
    top = [_top(entry, k) for entry in logprobs]
    pieces = [decoder.piece(t) for t in token_ids]
    return {
        "tokens": pieces,
        "token_logprobs": [entry[t] for t, entry in zip(token_ids, logprobs, strict=True)],
        "top_logprobs": [{decoder.piece(t): v for t, v in pairs} for pairs in top],
        "text_offset": _offsets(pieces, start),
    }


def chat_logprobs(
    token_ids: list[int], logprobs: list[Logprobs], k: int, decoder: Decoder
) -> dict[str, Any]:
    """`/v1/chat/completions` logprobs: per token its text, log-probability, bytes and top k."""
    content = []
    for token, entry in zip(token_ids, logprobs, strict=True):
        piece = decoder.piece(token)
        alternatives = [
            {"token": decoder.piece(t), "logprob": v, "bytes": list(decoder.piece(t).encode())}
            for t, v in _top(entry, k)
        ]
        content.append(
            {
                "token": piece,
                "logprob": entry[token],
                "bytes": list(piece.encode()),
                "top_logprobs": alternatives,
            }
        )
    return {"content": content}


def _top(entry: Logprobs, k: int) -> list[tuple[int, float]]:
    """The k most likely tokens of one position (the sampled one is in the entry too)."""
    return sorted(entry.items(), key=lambda item: -item[1])[:k]


def _offsets(pieces: list[str], start: int) -> list[int]:
    offsets, at = [], start
    for piece in pieces:
        offsets.append(at)
        at += len(piece)
    return offsets


def usage(prompt_tokens: int, completion_tokens: int, cached_tokens: int = 0) -> dict[str, Any]:
    """OpenAI's usage object; `prompt_tokens_details.cached_tokens` are the prompt tokens the
    prefix cache supplied (as OpenAI's and vLLM's servers report them)."""
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
        "prompt_tokens_details": {"cached_tokens": cached_tokens},
    }


def envelope(kind: str, response_id: str, model: str) -> dict[str, Any]:
    """The fields every response object and chunk carries."""
    return {"id": response_id, "object": kind, "created": int(time.time()), "model": model}
