"""Stopping on the running engine against the naive recompute loop: EOS ids, `ignore_eos`,
`min_tokens` (stop logits masked), stop_token_ids, and never past max_model_len."""

from __future__ import annotations

import numpy as np

from runtime.core.sampling_params import SamplingParams
from tests.runtime.conftest import MAX_MODEL_LEN, make_engine, naive_greedy


def test_eos_ignore_eos_and_min_tokens_against_naive_greedy(family):
    """EOS is the 4th token the model generates freely: one request stops there ("stop"), one
    ignores it, one must generate past it (its logits masked), one stops at a stop id."""
    prompt = np.random.default_rng(3).integers(0, 256, 11).tolist()
    free = naive_greedy(family, prompt, 10, stop_ids=())
    eos, first = free[3], free.index(free[3])
    engine = make_engine(family, eos_token_ids=(eos,))
    cases = {
        "eos": SamplingParams(max_tokens=10),
        "ignore": SamplingParams(max_tokens=10, ignore_eos=True),
        "min": SamplingParams(max_tokens=10, min_tokens=first + 1),
        "stop": SamplingParams(max_tokens=10, ignore_eos=True, stop_token_ids=(free[1],)),
    }
    for name, params in cases.items():
        engine.add_request(prompt, params, request_id=name)
    outputs = {}
    while engine.has_unfinished:
        outputs |= {o.request_id: o for o in engine.step()}
    assert (outputs["eos"].token_ids, outputs["eos"].finish_reason) == (free[: first + 1], "stop")
    assert (outputs["ignore"].token_ids, outputs["ignore"].finish_reason) == (free, "length")
    masked = naive_greedy(family, prompt, 10, stop_ids=(eos,), min_tokens=first + 1)
    assert outputs["min"].token_ids == masked and eos not in masked[: first + 1]
    assert masked[first] != eos and masked[:first] == free[:first]
    assert outputs["stop"].token_ids == free[: free.index(free[1]) + 1]
    assert outputs["stop"].finish_reason == "stop"


def test_prompt_plus_output_never_exceeds_max_model_len(family):
    """max_tokens asks for more than the room left: the request ends at max_model_len."""
    engine = make_engine(family)
    params = SamplingParams(max_tokens=20, ignore_eos=True)
    ids = {n: engine.add_request(list(range(1, n + 1)), params) for n in (MAX_MODEL_LEN - 1, 50)}
    outputs = {}
    while engine.has_unfinished:
        outputs |= {o.request_id: o for o in engine.step()}
    for n, request_id in ids.items():
        output = outputs[request_id]
        assert len(output.token_ids) == MAX_MODEL_LEN - n and output.finish_reason == "length"
