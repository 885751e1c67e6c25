"""Streaming, logprobs and stop strings on the running engine, against independent references:
the naive full-recompute loop (tokens, float64 log-softmax of its logits) and plain `str.find`
on the text of an unstopped run."""

from __future__ import annotations

import numpy as np
import pytest

from jmamba.text.tokenizer import byte_tokenizer
from runtime.core.sampling_params import SamplingParams
from runtime.engine import Engine
from tests.runtime.conftest import (
    base_config,
    make_engine,
    model_and_runner,
    naive_greedy,
    naive_logits,
)


@pytest.fixture(params=["mamba2"])
def family(request) -> str:
    """One family: streams, logprobs and stop strings are the same code whatever the model (the
    engine's tokens and logits per mixer are checked by test_random_schedules.py and
    test_checkpoints.py); the other two families cost 16 s of CI here."""
    return request.param


def text_engine(family: str) -> Engine:
    """An engine on the family's shared runner, reading text through the byte tokenizer."""
    model, runner = model_and_runner(family)
    return Engine(model, base_config(family), runner=runner, tokenizer=byte_tokenizer())


def naive_log_softmax(family: str, tokens: list[int]) -> np.ndarray:
    """float64 log-probabilities of the next token after `tokens`, by full recompute."""
    logits = naive_logits(family, tokens)
    shifted = logits - logits.max()
    return shifted - np.log(np.exp(shifted).sum())


def test_stream_deltas_add_up_to_the_outputs(family):
    """Each step adds at most one token per request; a request's deltas concatenate to its
    final tokens (equal to the naive loop's) and its last delta carries the output."""
    rng = np.random.default_rng(5)
    engine = make_engine(family)
    prompts = {
        engine.add_request(rng.integers(0, 256, n).tolist(), SamplingParams(max_tokens=5)): None
        for n in (3, 21, 9)
    }
    prompts = {rid: engine.request(rid).prompt_token_ids for rid in prompts}
    streamed: dict[str, list[int]] = {rid: [] for rid in prompts}
    finals = {}
    for delta in engine.stream():
        assert len(delta.token_ids) == 1 and delta.text is None and delta.logprobs is None
        streamed[delta.request_id] += delta.token_ids
        if delta.finished:
            finals[delta.request_id] = delta.output
            assert delta.finish_reason == delta.output.finish_reason
    for rid, prompt in prompts.items():
        assert streamed[rid] == finals[rid].token_ids == naive_greedy(family, prompt, 5)


def test_logprobs_match_the_naive_log_softmax(family):
    """The sampled token's log-probability and the top-k ids and values equal a float64
    log-softmax of the full-recompute logits; rows without logprobs get none."""
    prompt = np.random.default_rng(7).integers(0, 256, 13).tolist()
    engine = make_engine(family)
    with_lp = engine.add_request(prompt, SamplingParams(max_tokens=4, logprobs=3))
    without = engine.add_request(prompt[:5], SamplingParams(max_tokens=4))
    outputs = {}
    while engine.has_unfinished:
        outputs |= {o.request_id: o for o in engine.step()}
    assert outputs[without].logprobs is None
    output = outputs[with_lp]
    assert len(output.logprobs) == len(output.token_ids) == 4
    tokens = list(prompt)
    for token, entry in zip(output.token_ids, output.logprobs, strict=True):
        reference = naive_log_softmax(family, tokens)
        top = np.argsort(-reference, kind="stable")[:3]
        assert list(entry)[0] == token and set(entry) == {token, *top.tolist()}
        for tid, value in entry.items():
            assert value == pytest.approx(reference[tid], abs=1e-4)
        tokens.append(token)


def test_logprobs_zero_gives_the_sampled_token_only(family):
    engine = make_engine(family)
    rid = engine.add_request([1, 2, 3], SamplingParams(max_tokens=3, logprobs=0))
    outputs = {}
    while engine.has_unfinished:
        outputs |= {o.request_id: o for o in engine.step()}
    assert [list(e) for e in outputs[rid].logprobs] == [[t] for t in outputs[rid].token_ids]


def free_text(family: str, prompt: list[int], max_tokens: int) -> tuple[list[int], str]:
    tokens = naive_greedy(family, prompt, max_tokens, stop_ids=())
    return tokens, byte_tokenizer().decode(tokens)


def test_stop_string_cuts_the_text_and_keeps_the_tokens(family):
    """vLLM's semantics: text up to (not including) the first stop string, every token up to the
    one that completed it, finish reason "stop"; streamed text adds up to the final text."""
    prompt = np.random.default_rng(11).integers(32, 127, 9).tolist()
    tokens, text = free_text(family, prompt, 12)
    # The random-weight models write mostly invalid UTF-8: stop at printable ASCII after it.
    clean = [i for i in range(2, len(text)) if text[i].isascii() and text[i].isprintable()]
    stop = text[clean[0] : clean[0] + 2] if clean[0] + 1 in clean else text[clean[0]]
    cut = text.find(stop)
    needed = next(
        n for n in range(1, len(tokens) + 1) if stop in byte_tokenizer().decode(tokens[:n])
    )
    engine = text_engine(family)
    params = SamplingParams(max_tokens=12, ignore_eos=True, stop=[stop, "never seen"])
    rid = engine.add_request(prompt, params)
    pieces, output = [], None
    for delta in engine.stream():
        pieces.append(delta.text)
        output = delta.output or output
    assert output.finish_reason == "stop" and output.text == text[:cut]
    assert output.token_ids == tokens[:needed]
    assert "".join(pieces) == output.text and output.request_id == rid


def test_without_a_stop_string_the_text_is_the_whole_decode(family):
    prompt = [104, 105, 32]
    tokens, text = free_text(family, prompt, 6)
    engine = text_engine(family)
    engine.add_request(prompt, SamplingParams(max_tokens=6, ignore_eos=True))
    pieces = [delta.text for delta in engine.stream()]
    assert "".join(pieces) == text
    assert engine.inspect.block_owners() == {} and engine.inspect.slot_owners() == {}


def test_stop_strings_need_a_tokenizer(family):
    engine = make_engine(family)
    with pytest.raises(ValueError, match="stop strings need a tokenizer"):
        engine.add_request([1, 2], SamplingParams(stop="x"))


@pytest.mark.parametrize(
    "options, message",
    [
        (dict(logprobs=21), r"logprobs=21 must be an int in \[0, 20\]"),
        (dict(logprobs=-1), r"logprobs=-1"),
        (dict(stop=[""]), "stop entries must be non-empty strings"),
        (dict(stop=b"x"), "stop must be a str or a list of str"),
    ],
)
def test_bad_logprobs_and_stop_values_are_named(options, message):
    with pytest.raises(ValueError, match=message):
        SamplingParams(**options)


def test_logprobs_on_two_ranks_equal_one_rank():
    """Ranks agree on a mode that computes logprobs when any rank's request asks: each request
    gets exactly its own (equal to a one-device run), the others none."""
    from tests.runtime.parallel.test_data_parallel import dp_engine

    prompts = {"a": [3, 1, 4, 1, 5], "b": [9, 2, 6]}
    params = {"a": SamplingParams(max_tokens=3, logprobs=2), "b": SamplingParams(max_tokens=3)}
    results = []
    for engine in (make_engine("mamba2"), dp_engine("mamba2", 2)):
        for rid, prompt in prompts.items():
            engine.add_request(prompt, params[rid], request_id=rid)
        outputs = {}
        while engine.has_unfinished:
            outputs |= {o.request_id: o for o in engine.step()}
        results.append({rid: (o.token_ids, o.logprobs) for rid, o in outputs.items()})
    one, two = results
    assert one["b"][1] is None and two["b"][1] is None and one["a"][0] == two["a"][0]
    for left, right in zip(one["a"][1], two["a"][1], strict=True):
        assert left.keys() == right.keys()
        assert all(abs(left[t] - right[t]) < 1e-5 for t in left)
