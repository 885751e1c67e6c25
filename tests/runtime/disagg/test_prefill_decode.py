"""P/D in one process, for every family: prefill on one engine, hand over through the local
transport's bytes (`QueueTransport`), decode on another engine with caches of its own. The tokens
equal one engine's, the decode engine's rows equal, bitwise, the rows one engine holds after the
same tokens, and a lost, corrupt or refused hand-over fails its request with nothing left taken
on either side."""

from __future__ import annotations

import pytest

from runtime.core.sampling_params import SamplingParams
from runtime.disagg import DecodeInstance, PrefillInstance, QueueTransport
from runtime.disagg.pool_rows import engine_pool_rows
from tests.runtime.disagg.pairs import (
    DECODE_STEPS_COMPARED,
    FIXTURE_FAMILIES,
    PARAMS,
    PRESETS,
    PROMPTS,
    assert_bitwise,
    family,
    free_counts,
    host_caches,
    reference,
    request_rows,
    rows_outside,
)
from tests.tiers import slow_cases

FAMILIES = slow_cases((*PRESETS, *FIXTURE_FAMILIES), quick=PRESETS)


def instances(
    name: str, **decode_options
) -> tuple[PrefillInstance, DecodeInstance, QueueTransport]:
    fam = family(name)
    link = QueueTransport()
    prefill = PrefillInstance(fam.engine(fam.a), link)
    return prefill, DecodeInstance(fam.engine(fam.b, **decode_options), link), link


@pytest.mark.parametrize("name", FAMILIES)
def test_decode_continues_bitwise_from_the_handover(name):
    want = reference(name)
    prefill, decode, _ = instances(name)
    start = free_counts(prefill.engine), free_counts(decode.engine)
    ids = [prefill.add_request(p, PARAMS) for p in PROMPTS]
    step = prefill.step()
    assert [h.request_id for h in step.sent] == ids and not step.failed
    assert not prefill.has_unfinished and free_counts(prefill.engine) == start[0]
    rows = engine_pool_rows(decode.engine)
    before = host_caches(decode.engine)
    arrivals = decode.receive()
    assert arrivals.admitted == ids and not arrivals.failed
    taken = [decode.engine.request(i) for i in ids]
    blocks, slots = [b for r in taken for b in r.block_ids], [r.state_slot for r in taken]
    untouched = rows_outside(before, rows, blocks, slots)  # NULL, padding and the others' rows
    assert_bitwise(rows_outside(host_caches(decode.engine), rows, blocks, slots), untouched)
    for i in ids:  # what the scatter wrote into the decode engine's own caches
        assert decode.engine.request(i).output_token_ids == want.tokens[i][:1]
        assert_bitwise(request_rows(decode.engine, rows, i), want.after_prompt[i])
    for _ in range(DECODE_STEPS_COMPARED):
        decode.engine.step()
    for i in ids:  # and what its own decode steps made of it
        assert_bitwise(request_rows(decode.engine, rows, i), want.after_decodes[i])
    tokens = {}
    while decode.engine.has_unfinished:
        tokens |= {o.request_id: o.token_ids for o in decode.engine.step()}
    assert tokens == want.tokens
    assert free_counts(decode.engine) == start[1]


def test_a_request_its_first_token_finishes_arrives_finished():
    want = reference(PRESETS[0])
    prefill, decode, _ = instances(PRESETS[0])
    start = free_counts(prefill.engine), free_counts(decode.engine)
    request_id = prefill.add_request(PROMPTS[0], SamplingParams(max_tokens=1, ignore_eos=True))
    (handover,) = prefill.step().sent
    assert handover.finish_reason == "length" and handover.nbytes == 0
    (output,) = decode.receive().finished
    assert (output.request_id, output.token_ids) == (request_id, want.tokens["0"][:1])
    assert (free_counts(prefill.engine), free_counts(decode.engine)) == start


def test_a_lost_handover_fails_its_request_and_leaks_nothing():
    prefill, decode, link = instances(PRESETS[0])
    start = free_counts(prefill.engine), free_counts(decode.engine)
    request_id = prefill.add_request(PROMPTS[1], PARAMS)
    decode.expect(request_id, within=0.0)  # the router sent it here too
    link.close()  # the link drops while the prompt is computed
    step = prefill.step()
    (failed,) = step.failed
    assert failed.request_id == request_id and "not sent" in failed.error and not step.sent
    arrivals = decode.receive()
    assert [f.request_id for f in arrivals.failed] == [request_id]
    assert "no hand-over arrived" in arrivals.failed[0].error and not arrivals.admitted
    assert (free_counts(prefill.engine), free_counts(decode.engine)) == start
    assert not prefill.engine.has_unfinished and not decode.engine.has_unfinished


def test_a_corrupt_or_foreign_handover_is_refused_before_anything_is_taken():
    prefill, decode, link = instances(PRESETS[0])
    foreign = DecodeInstance(decode.engine, link, label="other weights")
    start = free_counts(decode.engine)
    for prompt in PROMPTS[:2]:
        prefill.add_request(prompt, PARAMS)
    prefill.step()
    link.queue[0] = link.queue[0][:-7]  # cut short on the way
    arrivals = foreign.receive()
    corrupt, mismatched = arrivals.failed
    assert "corrupt hand-over" in corrupt.error
    assert mismatched.request_id == "1" and "fingerprint" in mismatched.error
    assert not arrivals.admitted and free_counts(decode.engine) == start
    assert not decode.engine.has_unfinished


def test_an_asynchronous_multi_step_decode_engine_gives_the_same_tokens():
    """The decode engine's own scheduling (a step dispatched before the last one's tokens are
    known, three decode steps a program) does not change what a hand-over continues into."""
    want = reference(PRESETS[0])
    prefill, decode, _ = instances(PRESETS[0], async_scheduling=True, decode_steps=3)
    start = free_counts(decode.engine)
    for prompt in PROMPTS:
        prefill.add_request(prompt, PARAMS)
    prefill.step()
    tokens = {}
    decode.receive()
    while decode.engine.has_unfinished:
        tokens |= {o.request_id: o.token_ids for o in decode.engine.step()}
    assert tokens == want.tokens and free_counts(decode.engine) == start
