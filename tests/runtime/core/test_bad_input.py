"""Bad input, one test per class: a ValueError that names the argument, and the engine keeps
serving the requests it already has."""

from __future__ import annotations

import numpy as np
import pytest

from runtime.core.engine_args import EngineArgs
from runtime.core.sampling_params import SamplingParams
from tests.runtime.conftest import MAX_MODEL_LEN, make_engine, run_to_completion

GOOD = SamplingParams(max_tokens=3, ignore_eos=True)


def serving_engine():
    """An engine with one good request already running (it must still finish after each error)."""
    engine = make_engine("mamba2")
    good = engine.add_request([5, 6, 7], GOOD)
    engine.step()
    return engine, good


def assert_still_serves(engine, good: str) -> None:
    assert len(run_to_completion(engine)[good]) == GOOD.max_tokens
    assert not engine.inspect.scheduler.waiting and not engine.inspect.scheduler.running


@pytest.mark.parametrize(
    "prompt, message",
    [
        ([1.0, 2.0], r"prompt_token_ids\[0\]=float 1.0 is not an int token id"),
        ([1, True], r"prompt_token_ids\[1\]=bool True is not an int"),
        ([[1, 2], [3]], r"prompt_token_ids\[0\]=list \[1, 2\] is not an int"),
        ("123", "must be a list of int token ids, got str '123'"),
        (b"12", "must be a list of int token ids, got bytes"),
        (7, "must be a list of int token ids, got int 7"),
        (None, "got NoneType"),
        (np.array([1.0, 2.0]), "1-D array of integer token ids, got dtype=float64"),
        (np.array([[1, 2]]), r"shape=\(1, 2\)"),
        ([], "empty"),
        (list(range(MAX_MODEL_LEN)), "no room to generate"),
        ([3, 256], r"outside the vocabulary \[0, 256\)"),
        ([-1, 4], r"\[-1\] are outside the vocabulary"),
    ],
)
def test_bad_prompts_are_refused_by_name(prompt, message):
    engine, good = serving_engine()
    with pytest.raises(ValueError, match=message):
        engine.add_request(prompt, GOOD)
    assert_still_serves(engine, good)


def test_numpy_integer_prompts_are_accepted_and_a_full_prompt_leaves_room_for_one_token():
    engine = make_engine("mamba2")
    a = engine.add_request(np.array([5, 6, 7], np.int64), GOOD)
    b = engine.add_request([np.int32(5), np.uint8(6), 7], GOOD)
    longest = engine.add_request(list(range(1, MAX_MODEL_LEN)), GOOD)
    outputs = {o.request_id: o for o in _run(engine)}
    assert outputs[a].token_ids == outputs[b].token_ids and len(outputs[a].token_ids) == 3
    assert outputs[longest].finish_reason == "length" and len(outputs[longest].token_ids) == 1


def _run(engine):
    finished = []
    while engine.has_unfinished:
        finished += engine.step()
    return finished


@pytest.mark.parametrize(
    "options, message",
    [
        (dict(temperature="0.5"), "temperature='0.5' must be a finite number >= 0"),
        (dict(temperature=float("inf")), "temperature=inf"),
        (dict(temperature=-1.0), "temperature=-1.0"),
        (dict(top_p=None), r"top_p=None must be a finite number in \(0.0, 1.0\]"),
        (dict(top_p=0.0), "top_p=0.0"),
        (dict(top_k=1.5), "top_k=1.5 must be an int >= 0"),
        (dict(top_k=-2), "top_k=-2"),
        (dict(max_tokens=2.0), "max_tokens=2.0 must be an int >= 1"),
        (dict(max_tokens=0), "max_tokens=0"),
        (dict(min_tokens=5, max_tokens=4), r"min_tokens=5 must be an int in \[0, 4\]"),
        (dict(seed=True), "seed=True must be an int"),
        (dict(seed=-5), "seed=-5"),
        (dict(seed=2**32), "seed=4294967296"),
        (dict(stop_token_ids="12"), "stop_token_ids must be a list of int token ids"),
        (dict(stop_token_ids=[1.5]), r"stop_token_ids\[0\]=float 1.5"),
        (dict(stop_token_ids=[-3]), r"stop_token_ids \[-3\] are outside ids >= 0"),
        (dict(ignore_eos="yes"), "ignore_eos='yes' must be True or False"),
    ],
)
def test_wrong_typed_or_out_of_range_sampling_values(options, message):
    with pytest.raises(ValueError, match=message):
        SamplingParams(**options)


def test_sampling_values_are_normalised_to_python_types():
    params = SamplingParams(
        temperature=np.float32(0.5),
        top_k=np.int64(3),
        max_tokens=np.int32(4),
        stop_token_ids=np.array([1, 2]),
        seed=np.uint32(9),
    )
    types = type(params.temperature), type(params.top_k), type(params.max_tokens)
    assert types == (float, int, int)
    assert params.stop_token_ids == (1, 2) and params.seed == 9 and hash(params)


def test_stop_ids_outside_the_vocabulary_and_foreign_params_are_refused():
    engine, good = serving_engine()
    with pytest.raises(ValueError, match=r"stop_token_ids \[256\] are outside the vocabulary"):
        engine.add_request([1, 2], SamplingParams(stop_token_ids=(3, 256)))
    with pytest.raises(ValueError, match="must be a SamplingParams"):
        engine.add_request([1, 2], {"max_tokens": 3})
    assert_still_serves(engine, good)


def test_request_ids_are_strings_and_an_int_means_its_str_on_every_path():
    engine, good = serving_engine()
    assert engine.add_request([1, 2], GOOD, request_id=77) == "77"
    with pytest.raises(ValueError, match="request_id='77' is already in use"):
        engine.add_request([1, 2], GOOD, request_id="77")
    for bad in (1.5, True, ("a",)):
        with pytest.raises(ValueError, match="must be a str or an int"):
            engine.add_request([1, 2], GOOD, request_id=bad)
    for bad in (1.5, True, None):
        with pytest.raises(ValueError, match="must be a str or an int"):
            engine.abort(bad)
    assert engine.abort(77).finish_reason == "abort"
    assert engine.abort("77") is None  # already gone
    engine.add_request([1, 2], GOOD, request_id="x")
    assert engine.abort("x").request_id == "x"
    assert_still_serves(engine, good)


@pytest.mark.parametrize(
    "options, message",
    [
        (dict(num_blocks=10.0), "num_blocks=10.0 must be an int"),
        (dict(num_slots="4"), "num_slots='4' must be an int"),
        (dict(num_slots=1), "num_slots=1 must be an int >= 2"),
        (dict(max_num_seqs=True), "max_num_seqs=True must be an int"),
        (dict(max_num_batched_tokens=64.0), "max_num_batched_tokens=64.0"),
        (dict(max_model_len=1), "max_model_len=1 must be an int >= 2"),
        (dict(block_size=0), "block_size=0"),
        (dict(seed=True), "seed=True must be an int"),
        (dict(seed=1.5), "seed=1.5"),
        (dict(decode_row_buckets=(1.5, 8)), "decode_row_buckets entry=1.5 must be an int"),
        (dict(prefill_row_buckets="8"), "prefill_row_buckets='8' must be a tuple of ints"),
        (dict(prefill_token_buckets=(8,)), r"prefill_token_buckets=\(8,\) must be positive"),
        (dict(validate_inputs=1), "validate_inputs=1 must be True or False"),
        (dict(num_blocks=4, max_model_len=512), "num_blocks=4 must be >= 33"),
    ],
)
def test_engine_config_types_and_ranges(options, message):
    with pytest.raises(ValueError, match=message):
        EngineArgs(**{"max_num_batched_tokens": 64} | options)
