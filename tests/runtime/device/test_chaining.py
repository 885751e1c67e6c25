"""A decode row scheduled on drafts that the step before then rejected moves back on the device
(runtime/device/chaining.py) to the row the host builds once it knows how many were accepted:
the scheduler's own row at the verified position is the reference. A row of another request, and
a row after an all-accepted step, do not move."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jmamba.step.pytree  # noqa: F401  (registers StepInputs as a pytree)
from runtime.core.buckets import Bucket
from runtime.core.builder import build_dummy, build_step
from runtime.core.engine_args import EngineArgs
from runtime.core.schedule import Schedule, ScheduledRequest
from runtime.core.scheduler import Scheduler
from runtime.core.speculative_config import SpeculativeConfig
from runtime.core.step_batch import ChainedRows, StepBatch
from runtime.device.chaining import follow
from tests.runtime.core.test_scheduler import make_request, new_scheduler

K, BS, WIDTH, C = 3, 4, 4, 16  # drafts, block size, lanes per row, carried columns
BUCKET = Bucket(4, WIDTH, 0, 0)
SAMPLED, DRAFTED = 100, 200  # carried token ids: SAMPLED + lane of N's row, DRAFTED + draft j


def scheduler() -> Scheduler:
    config = EngineArgs(
        max_num_seqs=4,
        max_num_batched_tokens=32,
        max_model_len=64,
        block_size=BS,
        prefix_caching="off",
        async_scheduling=True,
        speculative=SpeculativeConfig("mtp", K),
    )
    return new_scheduler(config, chunk_size=4)


def build(schedule: Schedule) -> StepBatch:
    max_blocks = 64 // BS
    return build_step(schedule, BUCKET, block_size=BS, max_blocks=max_blocks, chain_width=WIDTH)


def with_drafts(schedule: Schedule, sources: bool) -> Schedule:
    """The drafter's part: each row with drafts feeds draft ids (a synchronous step), or takes
    the head's drafts of its request's row in flight from the carried array (row 0 of the
    previous step: the request's row was decode row 0 there)."""

    def drafted(item: ScheduledRequest) -> ScheduledRequest:
        k = item.num_tokens - 1
        if not k:
            return item
        if sources:
            return item._replace(draft_sources=tuple(j * C + 1 for j in range(1, 1 + k)))
        return item._replace(draft_token_ids=tuple(DRAFTED + j for j in range(1, 1 + k)))

    return Schedule([drafted(d) for d in schedule.decodes], schedule.prefills, [])


def carried(accepted: int) -> jnp.ndarray:
    """What step N hands on: its decode row 0 (K drafts, `accepted` of them) sampled SAMPLED +
    lane at each lane, its head drafted DRAFTED + j at the row's first column, and rejected
    K - accepted at each of its lanes; row 1 (the other request, one lane) rejected nothing."""
    array = np.zeros((2 + K, C), np.int32)
    array[0, : 1 + K] = SAMPLED + np.arange(1 + K)
    array[0, WIDTH] = SAMPLED + 50
    array[1 : 1 + K, 0] = DRAFTED + np.arange(1, 1 + K)
    array[-1, : 1 + K] = K - accepted
    return jnp.asarray(array)


def on_device(batch: StepBatch, previous: jnp.ndarray):
    inputs, sampling = jax.tree.map(jnp.asarray, (batch.inputs, batch.sampling))
    chained = jax.tree.map(jnp.asarray, batch.chained)
    sources = jnp.asarray(batch.token_sources)
    inputs, sampling = follow(inputs, sampling, sources, chained, previous, BS)
    return jax.tree.map(np.asarray, (inputs, sampling))


def decode_row(inputs, sampling, row: int, lanes: int) -> dict[str, list]:
    """What a decode row of the step feeds, reads and samples (its write slots apart)."""
    tokens = slice(row * WIDTH, row * WIDTH + lanes)
    return dict(
        token_ids=inputs.token_ids[tokens].tolist(),
        positions=inputs.positions[tokens].tolist(),
        kv_slots=inputs.kv_slots[tokens].tolist(),
        counters=sampling.counters[tokens].tolist(),
        seq_len=int(inputs.decode.seq_lens[row]),
        read_slot=int(inputs.decode.read_slots[row]),
    )


@pytest.mark.parametrize("next_drafts", [2, 0], ids=["drafting row", "one-token row"])
@pytest.mark.parametrize("accepted", [0, 1, K])
def test_a_chained_row_moves_back_to_the_row_built_from_the_truth(accepted, next_drafts):
    s = scheduler()
    request, other = make_request(6, max_tokens=20), make_request(5, max_tokens=20)
    s.add(request)
    s.add(other)
    first = s.schedule()
    s.postprocess(first, [7] * len(first.items))  # both prefilled, one output each

    def drafts(k: int):
        return lambda r: k if r is request else 0

    step_n = with_drafts(s.schedule(drafts(K)), sources=False)
    s.advance(step_n, build(step_n).sample_rows)
    step_next = with_drafts(s.schedule(drafts(next_drafts)), sources=True)
    assert step_next.decodes[0].chained_lanes == step_n.decodes[0].lane_slots
    assert not step_next.decodes[1].chained_lanes  # its row in flight had no drafts
    optimistic = build(step_next)

    # Step N retires: `accepted` drafts kept, then the token sampled at that lane.
    kept = [DRAFTED + j for j in range(1, 1 + accepted)]
    s.retire(step_n, [SAMPLED + accepted, SAMPLED + 50], [kept, []])
    truth = build(with_drafts(s.schedule(drafts(next_drafts)), sources=True))

    lanes = 1 + next_drafts
    moved = on_device(optimistic, carried(accepted))
    reference = on_device(truth, carried(accepted))
    assert decode_row(*moved, 0, lanes) == decode_row(*reference, 0, lanes)
    assert decode_row(*moved, 0, lanes)["read_slot"] == step_n.decodes[0].lane_slots[accepted]
    written = moved[0].decode.write_slots[0]
    if next_drafts:  # its lanes write the fresh slots it was given
        assert written[:lanes].tolist() == list(step_next.decodes[0].lane_slots)
    else:  # in place: the state it read
        assert written[0] == step_n.decodes[0].lane_slots[accepted]
    unmoved = jax.tree.map(np.asarray, (optimistic.inputs, optimistic.sampling))
    assert decode_row(*moved, 1, 1) == decode_row(*unmoved, 1, 1) | {"token_ids": [SAMPLED + 50]}

    # The host moves the row back the same way once it is dispatched.
    s.advance(step_next, optimistic.sample_rows)
    assert request.num_computed == 6 + 1 + accepted + lanes
    assert not s.in_flight.is_stale(step_next.decodes[0])


def test_validation_refuses_fallback_slots_of_other_rows_or_rows_that_may_not_shift():
    """A fallback slot is a slot the device may read (and write) instead of the row's own: it
    may sit only in a row that may shift, and no other row may read or write it (invariant 2)."""
    dummy = build_dummy(Bucket(2, 2, 0, 0), max_blocks=4, chain_width=3)
    writes = dummy.inputs.decode.write_slots.copy()
    writes[1, 0] = 5  # row 1 writes slot 5
    inputs = dataclasses.replace(
        dummy.inputs, decode=dataclasses.replace(dummy.inputs.decode, write_slots=writes)
    )
    fallback = np.zeros((2, 3), np.int32)
    fallback[0, 1:] = [6, 5]

    def batch(may_shift: list[bool]) -> StepBatch:
        chained = ChainedRows(np.array(may_shift), fallback)
        return dataclasses.replace(dummy, inputs=inputs, chained=chained)

    with pytest.raises(ValueError, match=r"decode rows \[0\] hold fallback slots"):
        batch([False, False]).validate_chained()
    with pytest.raises(ValueError, match=r"decode row 0's fallback slots \[5\] are other rows'"):
        batch([True, False]).validate_chained()
    fallback[0, 2] = 7
    batch([True, False]).validate_chained()  # slots 6 and 7: nobody else's
