"""`RequestText` against plain decoding: tokens arrive one at a time (the byte tokenizer splits
every multi-byte character over several tokens), stop strings against `str.find` on the decode
of each prefix."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from jmamba.text.tokenizer import byte_tokenizer
from runtime.outputs.detokenizer import RequestText

TOKENIZER = byte_tokenizer()
TEXT = st.text(alphabet=st.characters(codec="utf-8"), max_size=40)


def reference(ids: list[int], stops: tuple[str, ...]) -> tuple[int, str]:
    """(tokens read until a stop string appears, final text) from decoding every prefix."""
    for n in range(1, len(ids) + 1):
        text = TOKENIZER.decode(ids[:n])
        hits = [i for s in stops if (i := text.find(s)) >= 0]
        if hits:
            return n, text[: min(hits)]
    return len(ids), TOKENIZER.decode(ids)


def feed(ids: list[int], stops: tuple[str, ...]) -> tuple[int, str, list[str]]:
    """Feed `ids` one token at a time as the engine does; (tokens read, text, streamed pieces)."""
    text, pieces = RequestText(TOKENIZER, stops), []
    for n in range(1, len(ids) + 1):
        stopped = text.update(ids[:n])
        finished = stopped or n == len(ids)
        pieces.append(text.take(ids[:n], finished))
        if finished:
            return n, text.text(ids[:n]), pieces
    return 0, text.text([]), pieces


@given(
    TEXT,
    st.lists(st.text(alphabet=st.characters(codec="utf-8"), min_size=1, max_size=3), max_size=3),
)
def test_text_and_stop_strings_match_decoding_every_prefix(body, stops):
    ids = TOKENIZER.encode(body).ids
    stops = tuple(dict.fromkeys(stops))
    read, text, pieces = feed(ids, stops)
    assert (read, text) == reference(ids, stops) if ids else text == ""
    assert "".join(pieces) == text


@given(TEXT, TEXT, st.text(alphabet="xyz", min_size=1, max_size=3))
def test_a_stop_string_inside_the_text_is_found(before, after, stop):
    body = before + stop + after
    ids = TOKENIZER.encode(body).ids
    read, text, _ = feed(ids, (stop,))
    assert text == body[: body.find(stop)]
    assert TOKENIZER.decode(ids[:read]).endswith(stop) or stop in TOKENIZER.decode(ids[:read])


def test_an_unfinished_character_is_held_back_until_its_last_byte():
    ids = TOKENIZER.encode("é!").ids  # 0xC3 0xA9 0x21
    text = RequestText(TOKENIZER)
    assert not text.update(ids[:1]) and text.take(ids[:1], False) == ""
    text.update(ids[:2])
    assert text.take(ids[:2], False) == "é"
    assert text.take(ids, True) == "!" and text.text(ids) == "é!"
