"""A small numpy builder of `StepInputs` for model tests (the runtime has the production builder).

Rows are given explicitly: the test decides slots and blocks, so it can place requests at
non-trivial slot indices and add padding rows and padding tokens.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from jmamba.step.pytree import DecodeRows, PrefillRows, StepInputs


@dataclasses.dataclass
class Row:
    """One request's share of a step: its new tokens, context before them, slots and blocks."""

    tokens: list[int]
    num_computed: int
    read_slot: int
    write_slot: int
    blocks: list[int]


def build(
    decode: list[Row],
    prefill: list[Row],
    *,
    block_size: int,
    max_blocks: int,
    pad_decode_rows: int = 0,
    pad_prefill_rows: int = 0,
    pad_tokens: int = 0,
    all_logits: bool = False,
) -> StepInputs:
    """StepInputs with decode rows (1 lane each), prefill rows, and the requested padding."""
    rd, rp = len(decode) + pad_decode_rows, len(prefill) + pad_prefill_rows
    tp = sum(len(r.tokens) for r in prefill) + pad_tokens
    t = rd + tp
    token_ids, positions, kv_slots = (np.zeros(t, np.int32) for _ in range(3))

    def table(rows: list[Row], n: int) -> np.ndarray:
        out = np.zeros((n, max_blocks), np.int32)
        for i, r in enumerate(rows):
            out[i, : len(r.blocks)] = r.blocks
        return out

    def place(start: int, r: Row) -> None:
        for j, tok in enumerate(r.tokens):
            pos = r.num_computed + j
            token_ids[start + j], positions[start + j] = tok, pos
            kv_slots[start + j] = r.blocks[pos // block_size] * block_size + pos % block_size

    for i, r in enumerate(decode):
        place(i, r)
    qsl = np.zeros(rp + 1, np.int32)
    for i, r in enumerate(prefill):
        place(rd + qsl[i], r)
        qsl[i + 1] = qsl[i] + len(r.tokens)
    qsl[len(prefill) + 1 :] = qsl[len(prefill)]

    def column(rows: list[Row], n: int, f) -> np.ndarray:
        out = np.zeros(n, np.int32)
        out[: len(rows)] = [f(r) for r in rows]
        return out

    dec = DecodeRows(
        query_lens=column(decode, rd, lambda r: 1),
        seq_lens=column(decode, rd, lambda r: r.num_computed + 1),
        read_slots=column(decode, rd, lambda r: r.read_slot),
        write_slots=column(decode, rd, lambda r: r.write_slot)[:, None],
        block_table=table(decode, rd),
    )
    num_computed = column(prefill, rp, lambda r: r.num_computed)
    pre = PrefillRows(
        query_start_loc=qsl,
        num_computed=num_computed,
        seq_lens=column(prefill, rp, lambda r: r.num_computed + len(r.tokens)),
        has_initial_state=num_computed > 0,
        read_slots=column(prefill, rp, lambda r: r.read_slot),
        write_slots=column(prefill, rp, lambda r: r.write_slot),
        block_table=table(prefill, rp),
    )
    if all_logits:
        logits_indices = np.arange(t, dtype=np.int32)
    else:
        last = np.zeros(rp, np.int32)
        last[: len(prefill)] = rd + qsl[1 : len(prefill) + 1] - 1
        logits_indices = np.concatenate([np.arange(rd, dtype=np.int32), last])
    return StepInputs(token_ids, positions, kv_slots, dec, pre, logits_indices)
