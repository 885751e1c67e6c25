"""The vocabulary and special token ids every fixture's config shares."""

from __future__ import annotations

VOCAB = 128
IDS = dict(
    vocab_size=VOCAB,
    pad_token_id=0,
    bos_token_id=1,
    eos_token_id=2,
    max_position_embeddings=256,
)
