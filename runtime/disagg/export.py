"""`export_handover`: a prefilled request out of a prefill engine, as a `Handover`.

Called between steps, once the step that fed the prompt's last token has retired: the request
then holds its first output token (sampled by that step, as one engine would), `num_computed`
equals its prompt's length, and its KV blocks and state slot hold the prompt's effect and nothing
after it (its first token has not been fed). The rows are read from the runner's caches
(`PoolRows.read`, on the host) before the engine frees them, so whatever the transfer does next,
the prefill engine keeps no block or slot of the request (`PrefillInstance` aborts it at once).
"""

from __future__ import annotations

from runtime.core.pools import NULL
from runtime.core.request import Request
from runtime.disagg.handover import Handover, carried_params
from runtime.disagg.pool_rows import PoolRows
from runtime.engine import Engine


def is_prefilled(request: Request) -> bool:
    """Whether a request's prompt is computed and its first token known (none pending)."""
    return (
        request.num_computed == len(request.prompt_token_ids)
        and len(request.output_token_ids) == 1
        and request.num_pending == 0
    )


def export_handover(engine: Engine, rows: PoolRows, fingerprint: str, request_id: str) -> Handover:
    """The hand-over of a prefilled live request of `engine` (`is_prefilled`): its prompt, first
    token, seed and sampling params, and its blocks' and slot's contents read from the device.
    `rows`: the engine's `PoolRows`; `fingerprint`: its digest."""
    request = engine.request(request_id)
    if not is_prefilled(request):
        raise RuntimeError(
            f"request {request_id!r} is not at its prompt's end with one output token "
            f"(computed {request.num_computed} of {len(request.prompt_token_ids)}, "
            f"{len(request.output_token_ids)} outputs, {request.num_pending} pending)"
        )
    local = engine.requests.rank_of(request_id)
    slots = engine.schedulers[local].slots
    slot = slots.read_slot(request) if slots.uses_slots else NULL
    blocks, states = rows.read(
        engine.runner.caches,
        engine.ranks[local],
        request.block_ids,
        slot,
        engine.config.max_blocks_per_seq,
    )
    return Handover(
        request_id=request.request_id,
        prompt_token_ids=tuple(request.prompt_token_ids),
        output_token_ids=tuple(request.output_token_ids),
        sampling=carried_params(request.sampling_params),
        seed=request.seed,
        num_computed=request.num_computed,
        fingerprint=fingerprint,
        block_rows=tuple(blocks),
        slot_rows=tuple(states),
    )


def finished_handover(
    request_id: str,
    output_token_ids: list[int],
    prompt: list[int],
    finish_reason: str,
    fingerprint: str,
) -> Handover:
    """The hand-over of a request its first token finished on the prefill engine (a stop token,
    `max_tokens=1`): no rows, only its tokens and finish reason."""
    return Handover(
        request_id=request_id,
        prompt_token_ids=tuple(prompt),
        output_token_ids=tuple(output_token_ids),
        sampling={},
        seed=0,
        num_computed=len(prompt),
        fingerprint=fingerprint,
        finish_reason=finish_reason,
    )
