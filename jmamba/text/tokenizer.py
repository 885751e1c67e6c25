"""The byte-level tokenizer of the built-in presets: one token per byte, plus end-of-text.

Token ids (documented because models and tests depend on them):

* 0..255: the byte with that value (`"def "` -> [100, 101, 102, 32]); any text, in any encoding,
  round-trips through UTF-8 bytes.
* 256: `<|endoftext|>`, the end-of-text token: it separates documents in training and is the EOS
  of the trained presets. It only exists in a vocabulary of 257 or more, so the random-weight
  presets (vocabulary 256) see byte ids only and keep their own `eos_token_id`.

Built with the `tokenizers` library as a byte-level BPE without merges, so that `tokenizer.json`
is the standard format any `tokenizers`/transformers user can load. The library is imported lazily:
`jmamba` itself does not need it.
"""

from __future__ import annotations

from typing import Any

EOS_TOKEN = "<|endoftext|>"
EOS_ID = 256
VOCAB_SIZE = 257


def byte_alphabet() -> list[str]:
    """The printable character standing for each byte in byte-level BPE, indexed by byte value.

    Bytes that are printable Latin-1 characters stand for themselves; the others (controls,
    space, DEL, non-breaking space, soft hyphen) take the code points 256, 257, ... in byte order,
    so that every token of `tokenizer.json` is a visible string.
    """
    printable = {*range(ord("!"), ord("~") + 1), *range(0xA1, 0xAC + 1), *range(0xAE, 0xFF + 1)}
    alphabet, shifted = [], 256
    for byte in range(256):
        if byte in printable:
            alphabet.append(chr(byte))
        else:
            alphabet.append(chr(shifted))
            shifted += 1
    return alphabet


def byte_tokenizer() -> Any:
    """A `tokenizers.Tokenizer`: byte b <-> id b, `<|endoftext|>` <-> 256 (raises ImportError
    with an install hint when the `tokenizers` package is missing)."""
    try:
        from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers
    except ImportError as error:
        raise ImportError(
            "the byte-level tokenizer needs the `tokenizers` package: pip install tokenizers"
        ) from error
    vocab = {char: byte for byte, char in enumerate(byte_alphabet())}
    tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    # No regex split: without merges, words would not change the ids, only cost time.
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.add_special_tokens([AddedToken(EOS_TOKEN, special=True, normalized=False)])
    if tokenizer.token_to_id(EOS_TOKEN) != EOS_ID:
        raise AssertionError(f"{EOS_TOKEN} got id {tokenizer.token_to_id(EOS_TOKEN)}")
    return tokenizer
