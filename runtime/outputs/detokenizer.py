"""`RequestText`: one request's output text, decoded as its tokens arrive, cut at a stop string.

Decoding a whole output again every step costs O(length) per token; decoding token by token is
wrong for byte-level vocabularies, where one character may span several tokens. So each request
keeps two token offsets: `ids[prefix:read]` is a short window of tokens already turned into text,
decoded again together with the new tokens so that a character split across the boundary comes
out whole; the text the new tokens add is the difference of the two decodes. While the newest
tokens end inside a character (the decode ends with U+FFFD) they wait for the next token.

Stop strings follow vLLM's semantics: the text ends just before the first stop string found, the
finish reason is "stop", and the token ids keep every generated token. Streamed text holds back
its last `len(longest stop) - 1` characters until the request finishes, so a stop string that
arrives over several steps is never half-sent.
"""

from __future__ import annotations

from typing import Any

REPLACEMENT = "\ufffd"  # what a decoder writes for the bytes of an unfinished character


class RequestText:
    """Incremental text of one request (no jax; the tokenizer is a `tokenizers.Tokenizer`)."""

    def __init__(self, tokenizer: Any, stop: tuple[str, ...] = ()) -> None:
        self.tokenizer = tokenizer
        self.stop = stop
        self.stop_index: int | None = None  # the text is cut here (a stop string starts here)
        self._text = ""  # whole characters decoded so far
        self._prefix = 0
        self._read = 0
        self._taken = 0  # characters already handed out by `take`
        self._hold = max((len(s) for s in stop), default=1) - 1

    @property
    def stopped(self) -> bool:
        return self.stop_index is not None

    def update(self, output_ids: list[int]) -> bool:
        """Decode the tokens of `output_ids` (the request's whole output) not seen yet; returns
        True when a stop string has appeared (the text then ends before it)."""
        if self.stopped or len(output_ids) == self._read:
            return self.stopped
        window = self._decode(output_ids[self._prefix : self._read])
        decoded = self._decode(output_ids[self._prefix :])
        if decoded.endswith(REPLACEMENT) or len(decoded) <= len(window):
            return False  # an unfinished character: wait for the rest of its bytes
        searched_from = max(len(self._text) - self._hold, 0)
        self._text += decoded[len(window) :]
        self._prefix, self._read = self._read, len(output_ids)
        self._find_stop(searched_from)
        return self.stopped

    def text(self, output_ids: list[int]) -> str:
        """The final text: cut before the stop string, or everything the tokens decode to (an
        unfinished last character included, as the decoder writes it)."""
        if self.stopped:
            return self._text[: self.stop_index]
        window = self._decode(output_ids[self._prefix : self._read])
        return self._text + self._decode(output_ids[self._prefix :])[len(window) :]

    def take(self, output_ids: list[int], finished: bool) -> str:
        """The text not handed out yet; until `finished`, minus what may still start a stop
        string. The pieces taken add up to `text(output_ids)`."""
        if finished:
            whole = self.text(output_ids)
            end = len(whole)
        else:
            whole = self._text
            end = len(whole) - self._hold
        if end <= self._taken:
            return ""
        new, self._taken = whole[self._taken : end], end
        return new

    def _find_stop(self, searched_from: int) -> None:
        hits = [i for s in self.stop if (i := self._text.find(s, searched_from)) >= 0]
        if hits:
            self.stop_index = min(hits)

    def _decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids) if ids else ""
