"""The invariants (docs/architecture.md section 5) a `StepInputs` shows by itself, in numpy.

`check_step_inputs` runs them all; the runtime calls it on every step in tests and in debug mode.
Each check raises a ValueError naming the field, the row and the offending values. Pure numpy over
the dataclass fields (no jax, no pytree functions), so the host side can validate without loading
jax. This module reads `jmamba.step.inputs`, which knows nothing of it.

State slots (invariant 2, as prefix caching refines it). Every live *write* target of a step
(decode lanes, prefill final states, prefill boundary states) is distinct from every other, and
from every slot another row reads: XLA scatters with duplicate targets are undefined, and a read
racing a write would see either value. *Reads* may repeat: two requests that hit one cached prefix
both read its published slot in the same step, which is harmless because a slot read by two rows
is, by the rule above, written by neither (invariant 2 once asked reads to be distinct too; that
predates shared reads). A boundary slot is a fresh cache slot, read by no row, and lies
inside its row. Given the prefix cache's published slots and blocks, no step writes one of them
(copy-on-write by construction; vLLM #57253).
"""

from __future__ import annotations

import numpy as np

from jmamba.step.inputs import StepInputs


def check_step_inputs(
    inputs: StepInputs,
    *,
    block_size: int | None = None,
    chunk_size: int | None = None,
    num_blocks: int | None = None,
    num_slots: int | None = None,
    vocab_size: int | None = None,
    published_slots: np.ndarray | None = None,
    published_blocks: np.ndarray | None = None,
) -> None:
    """Check the invariants that the inputs alone show (numpy, cheap).

    Shapes and dtypes; no negative index anywhere; padding rows and tokens all NULL/zero/False;
    live rows before padding rows; positions, sequence lengths and `has_initial_state` consistent
    with `num_computed`; live write slots (decode lanes, every speculative lane included, dead
    lanes NULL; prefill final states; boundary states) pairwise distinct, none read by another
    row, a decode row rewriting its own read slot only from lane 0, boundary slots read by no row
    and only inside their row (only NULL repeats; reads may repeat, see the module docstring);
    block-table rows NULL past their blocks; logits indices on each row's last token. With the
    optional sizes also: ids inside their pools, KV slots matching the block table and pairwise
    distinct, prefill rows starting on multiples of `chunk_size`, token ids inside the vocab.
    With the prefix cache's published state slots and KV blocks: no step writes one of them.

    Raises:
      ValueError naming the field, the row and the values that break an invariant.
    """
    host = inputs.map_arrays(np.asarray)
    _check_layout(host)
    live_d = _check_decode(host)
    live_p = _check_prefill(host, chunk_size)
    _check_boundaries(host, chunk_size)
    _check_slots(host, live_d, published_slots)
    _check_bounds(host, num_blocks, num_slots, vocab_size, block_size)
    if block_size is not None:
        _check_blocks(host, live_d, live_p, block_size, published_blocks)


def _require(condition: object, message: str) -> None:
    """ValueError with `message` unless `condition` (a Python or numpy truth value) holds."""
    if not condition:
        raise ValueError(f"StepInputs: {message}")


def _check_layout(s: StepInputs) -> None:
    d, p = s.decode, s.prefill
    rd, w, rp, t = (
        d.write_slots.shape[0],
        d.write_slots.shape[1],
        p.read_slots.shape[0],
        s.num_tokens,
    )
    expected = {
        "token_ids": (s.token_ids, (t,)),
        "positions": (s.positions, (t,)),
        "kv_slots": (s.kv_slots, (t,)),
        "decode.query_lens": (d.query_lens, (rd,)),
        "decode.seq_lens": (d.seq_lens, (rd,)),
        "decode.read_slots": (d.read_slots, (rd,)),
        "prefill.query_start_loc": (p.query_start_loc, (rp + 1,)),
        "prefill.num_computed": (p.num_computed, (rp,)),
        "prefill.seq_lens": (p.seq_lens, (rp,)),
        "prefill.has_initial_state": (p.has_initial_state, (rp,)),
        "prefill.read_slots": (p.read_slots, (rp,)),
        "prefill.write_slots": (p.write_slots, (rp,)),
        "logits_indices": (s.logits_indices, (rd * w + rp,)),
    }
    for name, (array, shape) in expected.items():
        _require(array.shape == shape, f"{name}.shape={array.shape} must be {shape}")
    _require(
        d.block_table.ndim == 2 and d.block_table.shape[0] == rd,
        f"decode.block_table.shape={d.block_table.shape} must be ({rd}, max_blocks)",
    )
    _require(
        p.block_table.shape == (rp, d.block_table.shape[1]),
        f"prefill.block_table.shape={p.block_table.shape} must be ({rp}, {d.block_table.shape[1]})",
    )
    _require(t >= rd * w, f"num_tokens={t} must be >= decode rows x width = {rd * w}")
    bnd = p.boundary_slots
    _require(
        bnd is None or (bnd.ndim == 2 and bnd.shape[0] == rp),
        f"prefill.boundary_slots.shape={None if bnd is None else bnd.shape} must be ({rp}, NB)",
    )
    for key, array in s.named_arrays():
        if key.endswith("has_initial_state"):
            _require(array.dtype == np.bool_, f"{key}.dtype={array.dtype} must be bool")
            continue
        _require(array.dtype == np.int32, f"{key}.dtype={array.dtype} must be int32")
        low = int(array.min()) if array.size else 0
        _require(low >= 0, f"{key} holds {low}: no negative index may reach a device (NULL is 0)")


def _live_prefix(lengths: np.ndarray, what: str) -> np.ndarray:
    live = lengths > 0
    num_live = int(live.sum())
    _require(
        live[:num_live].all(),
        f"{what}: live rows must come before padding rows, got lengths {lengths.tolist()}",
    )
    return live


def _require_null(values: np.ndarray, where: np.ndarray, name: str) -> None:
    rows = values if values.ndim == 2 else values[:, None]
    bad = np.nonzero(where & np.any(rows != 0, axis=1))[0]
    _require(bad.size == 0, f"{name} of padding rows {bad.tolist()} must be NULL/0/False")


def _check_decode(s: StepInputs) -> np.ndarray:
    d = s.decode
    rd, w = d.write_slots.shape
    _require((d.query_lens <= w).all(), f"decode.query_lens={d.query_lens.tolist()} must be <= {w}")
    live = _live_prefix(np.asarray(d.query_lens), "decode")
    for name in ("seq_lens", "read_slots", "write_slots", "block_table"):
        _require_null(getattr(d, name), ~live, f"decode.{name}")
    num_computed = d.seq_lens - d.query_lens
    bad = np.nonzero(live & (num_computed <= 0))[0]
    _require(
        bad.size == 0,
        f"decode rows {bad.tolist()} have seq_lens <= query_lens: a decode "
        "row continues a state (a first chunk is always a prefill)",
    )
    lane = np.arange(w)[None, :]
    lane_live = lane < d.query_lens[:, None]
    _require(
        (d.write_slots[~lane_live] == 0).all(), "decode.write_slots of dead lanes must be NULL"
    )
    num_writes = ((d.write_slots != 0) & lane_live).sum(axis=1)
    bad = np.nonzero((num_writes > 0) & (num_writes != d.query_lens))[0]
    _require(
        bad.size == 0,
        f"decode rows {bad.tolist()} give a write slot to some live lanes and not others: the "
        "kernels treat a lane without one as padding (all live lanes write, or none: no state)",
    )
    idx = (np.arange(rd)[:, None] * w + lane).reshape(-1)
    lane_live = lane_live.reshape(-1)
    for name in ("token_ids", "positions", "kv_slots"):
        _require(
            (getattr(s, name)[idx[~lane_live]] == 0).all(), f"{name} of dead decode lanes != 0"
        )
    positions = (num_computed[:, None] + lane).reshape(-1)
    bad = np.nonzero(lane_live & (s.positions[idx] != positions))[0]
    _require(
        bad.size == 0,
        f"positions of decode lanes {bad.tolist()} must be seq_len - query_len + lane",
    )
    expected = np.where(lane_live, idx, 0)
    _require(
        (s.logits_indices[: rd * w] == expected).all(),
        f"decode logits_indices {s.logits_indices[: rd * w].tolist()} must be {expected.tolist()}",
    )
    return live


def _check_prefill(s: StepInputs, chunk_size: int | None) -> np.ndarray:
    p = s.prefill
    qsl, first = np.asarray(p.query_start_loc), s.num_decode_tokens
    lengths = np.diff(qsl)
    _require(
        qsl[0] == 0 and (lengths >= 0).all() and qsl[-1] <= s.num_prefill_tokens,
        f"prefill.query_start_loc={qsl.tolist()} must start at 0, not decrease and end <= "
        f"{s.num_prefill_tokens}",
    )
    live = _live_prefix(lengths, "prefill")
    for name in (
        "num_computed",
        "seq_lens",
        "has_initial_state",
        "read_slots",
        "write_slots",
        "block_table",
        "boundary_slots",
    ):
        if getattr(p, name) is not None:
            _require_null(getattr(p, name), ~live, f"prefill.{name}")
    bad = np.nonzero(live & (p.seq_lens != p.num_computed + lengths))[0]
    _require(bad.size == 0, f"prefill rows {bad.tolist()}: seq_lens must be num_computed + length")
    bad = np.nonzero(p.has_initial_state != (p.num_computed > 0))[0]
    _require(
        bad.size == 0, f"prefill rows {bad.tolist()}: has_initial_state must be num_computed > 0"
    )
    if chunk_size is not None:
        bad = np.nonzero(live & (p.num_computed % chunk_size != 0))[0]
        _require(
            bad.size == 0,
            f"prefill rows {bad.tolist()} start at {p.num_computed[bad].tolist()},"
            f" not on a multiple of chunk_size={chunk_size}",
        )
    row = np.repeat(np.arange(len(lengths)), lengths)
    expected = p.num_computed[row] + np.arange(qsl[-1]) - qsl[row]
    _require(
        (s.positions[first : first + qsl[-1]] == expected).all(),
        "positions of prefill tokens must be num_computed + offset in the row",
    )
    for name in ("token_ids", "positions", "kv_slots"):
        _require((getattr(s, name)[first + qsl[-1] :] == 0).all(), f"{name} of padding tokens != 0")
    expected = np.where(live, first + qsl[1:] - 1, 0)
    _require(
        (s.logits_indices[first:] == expected).all(),
        f"prefill logits_indices {s.logits_indices[first:].tolist()} must be {expected.tolist()}",
    )
    return live


def _check_boundaries(s: StepInputs, chunk_size: int | None) -> None:
    """Boundary slots: present exactly with a state block size, live only inside their row."""
    p = s.prefill
    sbs, bnd = p.state_block_size, p.boundary_slots
    _require(
        (bnd is None) == (sbs == 0),
        f"prefill.state_block_size={sbs} must be > 0 exactly when boundary_slots are given",
    )
    if bnd is None:
        return
    _require(
        chunk_size is None or sbs % chunk_size == 0,
        f"prefill.state_block_size={sbs} must be a multiple of chunk_size={chunk_size}",
    )
    column = np.arange(bnd.shape[1])[None, :]
    boundary = (p.num_computed[:, None] // sbs + column + 1) * sbs
    outside = (bnd != 0) & (boundary > p.seq_lens[:, None])
    bad = np.nonzero(outside.any(axis=1))[0]
    _require(
        bad.size == 0,
        f"prefill rows {bad.tolist()} have boundary slots past their last token "
        f"(state_block_size={sbs})",
    )


def _check_slots(s: StepInputs, live_d: np.ndarray, published_slots: np.ndarray | None) -> None:
    d, p = s.decode, s.prefill
    reads = np.concatenate([d.read_slots, p.read_slots])
    writes = [d.write_slots[r][d.write_slots[r] != 0] for r in range(len(live_d))]
    writes += [p.write_slots[r : r + 1][p.write_slots[r : r + 1] != 0] for r in range(p.num_rows)]
    continues = np.concatenate([live_d, p.has_initial_state])
    bad = np.nonzero(continues & (reads == 0) & np.array([w.size > 0 for w in writes], bool))[0]
    _require(bad.size == 0, f"rows {bad.tolist()} continue a state but read NULL")
    bnd = reads[:0] if p.boundary_slots is None else p.boundary_slots[p.boundary_slots != 0]
    every_write = np.concatenate([*writes, bnd])
    _require_distinct(every_write, "write slots (decode lanes, prefill final and boundary states)")
    for row, slots in enumerate(writes):
        others = np.delete(reads, row)
        clash = np.intersect1d(slots, others[others != 0])
        _require(clash.size == 0, f"row {row} writes slots {clash.tolist()} another row reads")
    clash = np.intersect1d(bnd, reads[reads != 0])
    _require(clash.size == 0, f"boundary slots {clash.tolist()} are read in the same step")
    if published_slots is not None:
        clash = np.intersect1d(every_write, np.asarray(published_slots))
        _require(clash.size == 0, f"a step writes published (cached) state slots {clash.tolist()}")
    later = (d.write_slots[:, 1:] == d.read_slots[:, None]) & (d.read_slots[:, None] != 0)
    bad = np.nonzero(later.any(axis=1))[0]
    _require(
        bad.size == 0,
        f"decode rows {bad.tolist()} write their read slot from a lane > 0: only a one-token "
        "update (lane 0) may rewrite its own slot; speculative lanes write fresh slots",
    )


def _require_distinct(values: np.ndarray, what: str) -> None:
    unique, counts = np.unique(values, return_counts=True)
    _require(
        (counts == 1).all(),
        f"live {what} {unique[counts > 1].tolist()} repeat within one "
        "step (duplicate scatter targets are undefined in XLA)",
    )


def _check_bounds(
    s: StepInputs,
    num_blocks: int | None,
    num_slots: int | None,
    vocab_size: int | None,
    block_size: int | None,
) -> None:
    limits = [
        ("token_ids", [s.token_ids], vocab_size),
        (
            "state slots",
            [
                s.decode.read_slots,
                s.decode.write_slots,
                s.prefill.read_slots,
                s.prefill.write_slots,
                *([] if s.prefill.boundary_slots is None else [s.prefill.boundary_slots]),
            ],
            num_slots,
        ),
        ("block tables", [s.decode.block_table, s.prefill.block_table], num_blocks),
    ]
    if num_blocks is not None and block_size is not None:
        limits.append(("kv_slots", [s.kv_slots], num_blocks * block_size))
    for name, arrays, limit in limits:
        if limit is not None:
            top = max((int(a.max()) for a in arrays if a.size), default=0)
            _require(top < limit, f"{name} hold {top}, outside [0, {limit})")


def _check_blocks(
    s: StepInputs,
    live_d: np.ndarray,
    live_p: np.ndarray,
    block_size: int,
    published_blocks: np.ndarray | None,
) -> None:
    d, p = s.decode, s.prefill
    tables = np.concatenate([d.block_table, p.block_table])
    seq_lens = np.concatenate([d.seq_lens, p.seq_lens])
    uses_blocks = bool(tables.any())
    num_used = -(-seq_lens // block_size)
    column = np.arange(tables.shape[1])[None, :]
    _require(
        (seq_lens <= tables.shape[1] * block_size).all(),
        f"seq_lens {seq_lens.tolist()} exceed the block table width x block_size",
    )
    _require(
        (tables[column >= num_used[:, None]] == 0).all(),
        "block-table columns past a row's blocks must be NULL (no stale tail)",
    )
    if not uses_blocks:
        _require(not s.kv_slots.any(), "kv_slots are set but every block table is NULL")
        return
    live = np.concatenate([live_d, live_p])
    _require(
        (tables[live[:, None] & (column < num_used[:, None])] != 0).all(),
        "live rows must have a non-NULL block for every block their tokens reach",
    )
    rows, positions, lanes = _live_token_rows(s, live_d)
    expected = tables[rows, positions // block_size] * block_size + positions % block_size
    _require(
        (s.kv_slots[lanes] == expected).all(),
        "kv_slots of live tokens must be block_table[row, pos // block_size] * block_size "
        "+ pos % block_size",
    )
    _require_distinct(np.asarray(s.kv_slots)[lanes], "kv_slots")
    if published_blocks is not None:
        clash = np.intersect1d(s.kv_slots[lanes] // block_size, np.asarray(published_blocks))
        _require(clash.size == 0, f"a step writes K/V into published blocks {clash.tolist()}")


def _live_token_rows(
    s: StepInputs, live_d: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(row in decode+prefill order, position, token index) of every live token."""
    d, p = s.decode, s.prefill
    rd, w = d.write_slots.shape
    lane = np.arange(w)[None, :]
    lane_live = (lane < d.query_lens[:, None]).reshape(-1)
    d_index = np.arange(rd * w)[lane_live]
    lengths = np.diff(p.query_start_loc)
    p_rows = rd + np.repeat(np.arange(len(lengths)), lengths)
    p_index = rd * w + np.arange(np.asarray(p.query_start_loc)[-1])
    rows = np.concatenate([d_index // w, p_rows]).astype(np.int64)
    index = np.concatenate([d_index, p_index]).astype(np.int64)
    return rows, np.asarray(s.positions)[index], index
