"""A byte-level BPE tokenizer of 256 byte tokens and an EOS (id 256), as the tiny-stdlib
preset's, built in memory for the structured-output tests."""

from __future__ import annotations

from tokenizers import Tokenizer, decoders, models, pre_tokenizers

EOS = 256


def byte_tokenizer() -> Tokenizer:
    alphabet = pre_tokenizers.ByteLevel.alphabet()
    byte_chars = sorted(alphabet, key=lambda c: _byte_of(c))
    vocab = {char: i for i, char in enumerate(byte_chars)} | {"<eos>": EOS}
    tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.add_special_tokens(["<eos>"])
    return tokenizer


def _byte_of(char: str) -> int:
    """The byte a ByteLevel alphabet character stands for (GPT-2's table)."""
    printable = [*range(ord("!"), ord("~") + 1), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    shifted = [b for b in range(256) if b not in printable]
    table = {chr(b): b for b in printable} | {chr(256 + i): b for i, b in enumerate(shifted)}
    return table[char]
