"""Structured outputs' host cost: filling B rows of allowed-token bitmasks per step, per grammar
engine, at B = 64 on the CPU that serves (the masks are filled on the host while the device
waits for its inputs).

Each engine gets the same synthetic byte-level vocabulary (256 bytes, a few JSON pieces, then
random strings of letters, digits, spaces and JSON punctuation up to `--vocab`: the worst case,
real vocabularies mask faster) and the same JSON schema (compact JSON, bounded strings and
arrays); B matchers each take a random allowed token per step for `--steps` steps. Reported
per engine: tokenizer setup, grammar compile, and per step the mask fill (ms for all B rows, us
a row) and the token advance. llguidance (`runtime.structured`'s engine) always; xgrammar when
it is installed (it needs torch, transformers and triton; `pip install xgrammar`).

    python -m benchmarks.serving structured_masks                      # B = 64, V = 151936
    python -m benchmarks.serving structured_masks --vocab 32000 --steps 10
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import random
import string
import time
from collections.abc import Callable

import numpy as np

SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 40},
        "age": {"type": "integer"},
        "tags": {"type": "array", "items": {"type": "string", "maxLength": 10}, "maxItems": 5},
        "ok": {"type": "boolean"},
    },
    "required": ["name", "age", "tags", "ok"],
    "additionalProperties": False,
}
PIECES = ['{"', '":', '",', '"}', ' "', '": "', "[", "]", ", ", "true", "false", "null"]
EOS = "<|eos|>"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, default=64, help="B, matchers filled per step")
    parser.add_argument("--vocab", type=int, default=151936, help="V, the vocabulary size")
    parser.add_argument("--steps", type=int, default=40, help="steps timed")
    return parser.parse_args(argv)


def synthetic_vocab(size: int, seed: int = 0) -> list[bytes]:
    """`size - 1` distinct byte strings: the 256 bytes, `PIECES`, then random strings."""
    tokens = [bytes([b]) for b in range(256)] + [p.encode() for p in PIECES]
    seen, rng = set(tokens), random.Random(seed)
    alphabet = string.ascii_letters + string.digits + '      _.,:"{}'
    while len(tokens) < size - 1:
        word = "".join(rng.choice(alphabet) for _ in range(rng.randint(2, 9))).encode()
        if word not in seen:
            seen.add(word)
            tokens.append(word)
    return tokens


def tokenizer_json(tokens: list[bytes]) -> str:
    """A byte-level BPE tokenizer.json of `tokens` and an EOS after them (no merges: the mask
    engines read the vocabulary, never tokenize)."""
    from tokenizers import pre_tokenizers

    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet(), key=_byte_of)
    vocab = {"".join(alphabet[b] for b in token): i for i, token in enumerate(tokens)}
    vocab[EOS] = len(tokens)
    eos = {"id": len(tokens), "content": EOS, "special": True, "single_word": False}
    eos |= {"lstrip": False, "rstrip": False, "normalized": False}
    byte_level = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True}
    model: dict[str, object] = {"type": "BPE", "vocab": vocab, "merges": [], "dropout": None}
    body = {"version": "1.0", "added_tokens": [eos], "pre_tokenizer": byte_level}
    return json.dumps(body | {"decoder": byte_level, "model": model})


def _byte_of(char: str) -> int:
    printable = [*range(ord("!"), ord("~") + 1), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    shifted = [b for b in range(256) if b not in printable]
    table = {chr(b): b for b in printable} | {chr(256 + i): b for i, b in enumerate(shifted)}
    return table[char]


def walk(
    rows: int, steps: int, vocab: int, fill: Callable[[], np.ndarray], advance: Callable
) -> tuple[float, float]:
    """Seconds per step filling every row, and advancing each by a random allowed token."""
    rng = np.random.default_rng(0)
    fill_seconds = advance_seconds = 0.0
    for _ in range(steps):
        start = time.perf_counter()
        bitmask = fill()
        fill_seconds += time.perf_counter() - start
        bits = np.unpackbits(bitmask.view(np.uint8), axis=1, bitorder="little")[:, :vocab]
        start = time.perf_counter()
        for row in range(rows):
            allowed = np.flatnonzero(bits[row])
            advance(row, int(rng.choice(allowed)))
        advance_seconds += time.perf_counter() - start
    return fill_seconds / steps, advance_seconds / steps


def llguidance_run(args: argparse.Namespace, tokens: list[bytes]) -> dict[str, float]:
    import llguidance
    import llguidance.numpy

    start = time.perf_counter()
    tokenizer = llguidance.LLTokenizer(tokenizer_json(tokens), n_vocab=args.vocab)
    setup = time.perf_counter() - start
    grammar = llguidance.LLMatcher.grammar_from_json_schema(
        SCHEMA, defaults={"whitespace_flexible": False}
    )
    start = time.perf_counter()
    compiled = llguidance.LLMatcher(tokenizer, grammar)
    compile_seconds = time.perf_counter() - start
    matchers = [compiled.deep_copy() for _ in range(args.rows)]
    bitmask = llguidance.numpy.allocate_token_bitmask(args.rows, args.vocab)

    def fill() -> np.ndarray:
        for row, matcher in enumerate(matchers):
            llguidance.numpy.fill_next_token_bitmask(matcher, bitmask, row)
        return bitmask

    def advance(row: int, token: int) -> None:
        if not matchers[row].is_stopped():
            matchers[row].consume_token(token)

    per_step = walk(args.rows, args.steps, args.vocab, fill, advance)
    return _report(setup, compile_seconds, per_step, args.rows)


def xgrammar_run(args: argparse.Namespace, tokens: list[bytes]) -> dict[str, float]:
    import xgrammar

    start = time.perf_counter()
    encoded = tokens + [EOS.encode()] * (args.vocab - len(tokens))
    info = xgrammar.TokenizerInfo(
        encoded, xgrammar.VocabType.RAW, vocab_size=args.vocab, stop_token_ids=[len(tokens)]
    )
    compiler = xgrammar.GrammarCompiler(info)
    setup = time.perf_counter() - start
    start = time.perf_counter()
    compiled = compiler.compile_json_schema(json.dumps(SCHEMA), any_whitespace=False)
    compile_seconds = time.perf_counter() - start
    matchers = [xgrammar.GrammarMatcher(compiled) for _ in range(args.rows)]
    bitmask = xgrammar.allocate_token_bitmask(args.rows, args.vocab)

    def fill() -> np.ndarray:
        for row, matcher in enumerate(matchers):
            matcher.fill_next_token_bitmask(bitmask, row)
        return bitmask.numpy()

    def advance(row: int, token: int) -> None:
        if not matchers[row].is_terminated():
            matchers[row].accept_token(token)

    per_step = walk(args.rows, args.steps, args.vocab, fill, advance)
    return _report(setup, compile_seconds, per_step, args.rows)


def _report(
    setup: float, compile_seconds: float, per_step: tuple[float, float], rows: int
) -> dict[str, float]:
    fill, advance = per_step
    return {
        "setup_ms": 1e3 * setup,
        "compile_ms": 1e3 * compile_seconds,
        "fill_ms_per_step": 1e3 * fill,
        "fill_us_per_row": 1e6 * fill / rows,
        "advance_ms_per_step": 1e3 * advance,
    }


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    tokens = synthetic_vocab(args.vocab)
    engines = {"llguidance": llguidance_run}
    if importlib.util.find_spec("xgrammar") is not None:
        engines["xgrammar"] = xgrammar_run
    for name, run in engines.items():
        result = run(args, tokens)
        print(json.dumps({"engine": name, "rows": args.rows, "vocab": args.vocab} | result))


if __name__ == "__main__":
    main()
