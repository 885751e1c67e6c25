"""`admit_handover`: a `Handover` into a decode engine, as a running request already computed.

Everything that can refuse it is checked before anything is taken: the fingerprint, the request
(its id free, its prompt and params valid for this engine, as `Engine.add_request` checks them),
and the rows' count and shapes against this engine's caches. Then the router places it, its
rank's scheduler gives it a slot and fresh blocks (`Scheduler.enter_computed`; no room: nothing
taken, the caller retries), and one jitted scatter writes the rows into them with the caches
donated (`PoolRows.write`: live entries only, NULL never written). If that write fails, the
scheduler takes the slot and blocks back before the error goes on. The request enters with
`num_computed` = its prompt and its first token as its first output, so its next step is a
decode row that feeds that token: the prompt is not recomputed (the runtime/disagg package
docstring says why).
"""

from __future__ import annotations

import time

import numpy as np

from runtime.core.request import Request
from runtime.disagg.fingerprint import Fingerprint
from runtime.disagg.handover import Handover
from runtime.disagg.pool_rows import BLOCK, SLOT, PoolRows
from runtime.disagg.transport import TransferError
from runtime.engine import Engine


def check_handover(engine: Engine, rows: PoolRows, fingerprint: Fingerprint, h: Handover) -> None:
    """TransferError naming why `engine` cannot take `h`; nothing is taken either way."""
    mismatch = fingerprint.mismatch(h.fingerprint)
    if mismatch is not None:
        raise TransferError(f"request {h.request_id!r}: {mismatch}", h.request_id)
    if engine.requests.local_rank(h.request_id) is not None:
        raise TransferError(f"request {h.request_id!r} is already live here", h.request_id)
    if h.finish_reason is not None:
        return
    expected = [(shape, dtype) for kind, shape, dtype in rows.row_layout if kind == SLOT]
    got = [(tuple(a.shape), a.dtype.name) for a in h.slot_rows]
    blocks = -(-h.num_computed // engine.config.block_size) if BLOCK in rows.kinds else 0
    block_rows = [(tuple(a.shape), a.dtype.name) for a in h.block_rows]
    want_blocks = [((blocks, *shape), d) for kind, shape, d in rows.row_layout if kind == BLOCK]
    if got != expected or block_rows != want_blocks:
        raise TransferError(
            f"request {h.request_id!r}: its rows do not fit this engine's caches "
            f"(slots {got} for {expected}, blocks {block_rows} for {want_blocks})",
            h.request_id,
        )
    if len(h.output_token_ids) != 1 or h.num_computed != len(h.prompt_token_ids):
        raise TransferError(f"request {h.request_id!r}: not at its prompt's end", h.request_id)


def new_request(engine: Engine, h: Handover) -> Request:
    """The decode side's request of `h` (checked as `Engine.add_request` checks one), its first
    token appended and its prompt counted as computed; not yet placed anywhere."""
    try:
        prompt, params = engine.check_request(list(h.prompt_token_ids), h.sampling_params())
        engine.drafter.check(params)
        request = engine.requests.new(prompt, params, h.request_id)
    except (ValueError, TypeError, KeyError) as e:
        raise TransferError(f"request {h.request_id!r} refused: {e}", h.request_id) from e
    request.output_token_ids = list(h.output_token_ids)
    request.num_computed = h.num_computed
    request.first_token_time = time.perf_counter()  # its first token came with it
    return request


def admit_handover(
    engine: Engine, rows: PoolRows, fingerprint: Fingerprint, h: Handover
) -> Request | None:
    """Enter `h` into `engine` as a running decode (module docstring); returns the request, or
    None when no rank has room now (nothing taken). TransferError when it is refused."""
    check_handover(engine, rows, fingerprint, h)
    request = new_request(engine, h)
    local = engine.router.place(request, engine.schedulers)
    scheduler = engine.schedulers[local]
    if not scheduler.enter_computed(request, h.num_blocks):
        return None
    try:
        engine.runner.caches = rows.write(
            engine.runner.caches,
            engine.ranks[local],
            request.block_ids,
            request.state_slot,
            [np.asarray(a) for a in h.block_rows],
            [np.asarray(a) for a in h.slot_rows],
            engine.config.max_blocks_per_seq,
        )
    except Exception:
        scheduler.abort(request.request_id)  # gives its slot and blocks back
        raise
    engine.requests.add(request, local)
    engine.outputs.add(request)
    return request
