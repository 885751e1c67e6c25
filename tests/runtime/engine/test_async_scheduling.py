"""Asynchronous scheduling: step N + 1 is dispatched before step N's tokens reach the host, and
the outputs are those of the synchronous engine, token for token, for everything the tokens
carry: seeded sampling (top-k, top-p), min_tokens masks, logprobs, stop strings, streaming.

The hypothesis schedules of test_random_schedules.py, test_prefix_caching.py,
test_data_parallel.py and test_speculative_schedules.py draw `async_scheduling` too (preemption,
aborts, prefix hits, idle ranks, drafts).
"""

from __future__ import annotations

import dataclasses

import jax
import numpy as np
import pytest

from jmamba.text.tokenizer import byte_tokenizer
from runtime.core.buckets import Bucket
from runtime.core.builder import build_dummy
from runtime.core.engine_args import EngineArgs
from runtime.core.sampling_params import SamplingParams
from runtime.device.memory import resolve_config
from runtime.device.model_runner import ModelRunner
from runtime.engine import Engine
from tests.runtime.conftest import (
    base_config,
    make_engine,
    model_and_runner,
    naive_greedy,
    naive_logits,
)
from tests.runtime.core.test_penalties import reference_logits
from tests.runtime.speculative.spec_support import assert_serves_naive_greedy, spec_engine
from tests.runtime.speculative.test_speculative import assert_pools_empty

PARAMS = (
    SamplingParams(max_tokens=7),
    SamplingParams(max_tokens=6, temperature=0.8, seed=11, logprobs=2),
    SamplingParams(max_tokens=5, temperature=1.2, top_k=5, top_p=0.9, seed=3, min_tokens=3),
    SamplingParams(max_tokens=8, temperature=0.7, stop=["e"], logprobs=0),
    SamplingParams(max_tokens=1),
)


def text_engine(family: str, async_scheduling: bool) -> Engine:
    model, runner = model_and_runner(family)
    config = dataclasses.replace(base_config(family), async_scheduling=async_scheduling)
    return Engine(model, config, runner=runner, tokenizer=byte_tokenizer())


def serve(engine: Engine, prompts: list[list[int]]) -> dict:
    """Every prompt with its PARAMS entry (by index), streamed: {id: (output, streamed tokens,
    streamed text)}."""
    for i, prompt in enumerate(prompts):
        engine.add_request(prompt, PARAMS[i % len(PARAMS)], request_id=i)
    streamed: dict[str, tuple[list[int], str]] = {str(i): ([], "") for i in range(len(prompts))}
    outputs = {}
    for delta in engine.stream():
        ids, text = streamed[delta.request_id]
        streamed[delta.request_id] = (ids + delta.token_ids, text + (delta.text or ""))
        if delta.finished:
            outputs[delta.request_id] = delta.output
    return {rid: (outputs[rid], *streamed[rid]) for rid in outputs}


# One family: what this test adds (sampling, logprobs, stop strings, streams under asynchronous
# scheduling) is the same code whatever the model; test_random_schedules.py serves every mixer,
# with attention, asynchronously against the naive loop (qwen3_next here cost 31 s of CI).
@pytest.mark.parametrize("family", ["mamba2"])
def test_async_outputs_equal_the_synchronous_engine(family):
    """Greedy, seeded sampling, min_tokens, logprobs, a stop string, max_tokens=1; prompts long
    enough to preempt in the small pools: identical outputs, streams and finish reasons."""
    rng = np.random.default_rng(21)
    prompts = [rng.integers(0, 256, n).tolist() for n in (5, 30, 12, 40, 3, 17, 26)]
    sync = serve(text_engine(family, False), prompts)
    asynchronous = serve(text_engine(family, True), prompts)
    assert_served_alike(asynchronous, sync, len(prompts))
    assert sync["0"][0].token_ids == naive_greedy(family, prompts[0], 7)


def assert_served_alike(served: dict, expected: dict, num_prompts: int) -> None:
    """`serve`'s results equal `expected`'s for every prompt: tokens (streamed too), finish
    reason, text (streamed too), logprobs within 1e-5 (`assert_logprobs_close`)."""
    assert served.keys() == expected.keys() == {str(i) for i in range(num_prompts)}
    for rid, (output, tokens, text) in served.items():
        want = expected[rid][0]
        assert output.token_ids == want.token_ids == tokens, rid
        assert (output.finish_reason, output.text, text) == (
            want.finish_reason,
            want.text,
            want.text,
        ), rid
        assert_logprobs_close(output.logprobs, want.logprobs)


def assert_logprobs_close(got, expected) -> None:
    """Same tokens, log-probabilities within 1e-5: a row's logits may come from another bucket
    (batch invariance promises equal tokens, and logits equal to float rounding)."""
    if expected is None:
        assert got is None
        return
    assert [list(d) for d in got] == [list(d) for d in expected]
    for g, e in zip(got, expected, strict=True):
        np.testing.assert_allclose(list(g.values()), list(e.values()), atol=1e-5)


class _CallLog:
    """Wraps a runner's dispatch and fetch, logging ('dispatch', step) and ('fetch', step)."""

    def __init__(self, runner) -> None:
        self.events: list[tuple[str, int]] = []
        self._dispatch, self._fetch = runner.dispatch, runner.fetch
        self._ids, self._handles = {}, []

    def dispatch(self, bucket, batches, **options):
        handle = self._dispatch(bucket, batches, **options)
        self._handles.append(handle)  # alive: a freed handle's id() could be reused
        self._ids[id(handle)] = len(self._ids)
        self.events.append(("dispatch", self._ids[id(handle)]))
        return handle

    def fetch(self, handle):
        self.events.append(("fetch", self._ids[id(handle)]))
        return self._fetch(handle)


def test_each_step_is_fetched_after_the_next_one_is_dispatched(monkeypatch):
    """The host learns step N's tokens only after step N + 1 is on the device (except the last
    step, fetched when nothing is left to schedule); the synchronous engine fetches each step
    before dispatching the next."""
    family = "nemotron_h"
    prompt = np.random.default_rng(2).integers(0, 256, 9).tolist()
    logs = {}
    for async_scheduling in (False, True):
        engine = make_engine(family, async_scheduling=async_scheduling)
        log = logs[async_scheduling] = _CallLog(engine.runner)
        monkeypatch.setattr(engine.runner, "dispatch", log.dispatch)
        monkeypatch.setattr(engine.runner, "fetch", log.fetch)
        engine.add_request(prompt, SamplingParams(max_tokens=4))
        while engine.has_unfinished:
            engine.step()
        monkeypatch.undo()
    n = 4  # one prefill step, three decode steps
    assert logs[False].events == [(kind, i) for i in range(n) for kind in ("dispatch", "fetch")]
    overlapped = [("dispatch", 0)] + [
        e for i in range(1, n) for e in (("dispatch", i), ("fetch", i - 1))
    ]
    assert logs[True].events == overlapped + [("fetch", n - 1)]


def test_a_stop_learned_one_step_late_frees_everything():
    """A request stopped by its EOS token is still scheduled once more (the host has not seen
    the token yet): that row is dropped, the output ends at the EOS, and every block and slot
    returns to the pools."""
    family = "mamba2"
    prompt = [5, 6, 7, 8]
    free = naive_greedy(family, prompt, 6, stop_ids=())
    engine = make_engine(family, eos_token_ids=(free[2],), async_scheduling=True)
    rid = engine.add_request(prompt, SamplingParams(max_tokens=6))
    outputs = {}
    while engine.has_unfinished:
        outputs |= {o.request_id: o for o in engine.step()}
    assert outputs[rid].token_ids == free[: free.index(free[2]) + 1]
    assert outputs[rid].finish_reason == "stop"
    scheduler = engine.inspect.scheduler
    assert scheduler.block_pool.num_used == 0 and scheduler.slot_pool.num_used == 0


@pytest.mark.parametrize("method", ["ngram", "mtp"])
def test_drafting_steps_and_larger_steps_run_as_their_drafter_allows(monkeypatch, method):
    """max_batch_size=1: while two or three requests run, steps carry no drafts and run
    asynchronously (each takes its tokens from the step before on the device); once one is left
    it drafts. Prompt lookup needs every token on the host: its drafting steps are synchronous
    (the step in flight is retired first). The MTP head's drafts come out of the step itself:
    its drafting steps stay asynchronous and take them from the step before, as the tokens.
    After an MTP step without drafts no request has drafts to feed. Tokens equal the naive
    greedy loop's."""
    family = "nemotron_h"
    engine = spec_engine(family, method, 2, max_batch_size=1, async_scheduling=True)
    dispatched = []
    dispatch = engine.runner.dispatch

    def logged(bucket, batches, **options):
        # A step takes tokens from the one before on the device where some source is not NULL.
        takes = any(batch.token_sources.any() for batch in batches)
        dispatched.append((takes, options["drafts"], bucket.width))
        return dispatch(bucket, batches, **options)

    monkeypatch.setattr(engine.runner, "dispatch", logged)
    forgot = []  # after each step without drafts: whether no running request has drafts left
    dispatched_to_drafter = engine.drafter.dispatched

    def dispatched_logged(schedule, bucket, moved, drafted):
        dispatched_to_drafter(schedule, bucket, moved, drafted)
        if not drafted:
            running = engine.inspect.scheduler.running
            forgot.append(all(engine.drafter.num_wanted(r) == 0 for r in running))

    if method == "mtp":  # (prompt lookup proposes from the host's tokens, whenever asked)
        monkeypatch.setattr(engine.drafter, "dispatched", dispatched_logged)
    prompts = [[3, 4, 3, 4, 3, 4, 3], [7, 8, 9, 7, 8, 9], [5, 5, 5, 5]]
    lengths = [4, 7, 16]
    assert_serves_naive_greedy(engine, family, prompts, lengths)
    drafting = {takes for takes, drafts, _ in dispatched if drafts}
    assert (True in drafting) == (method == "mtp")  # prompt lookup's steps take nothing
    assert any(takes for takes, drafts, _ in dispatched if not drafts)  # plain steps: async
    assert any(width > 1 for _, drafts, width in dispatched if drafts)
    assert engine.stats.num_drafting_steps == sum(drafts for _, drafts, _ in dispatched)
    assert method != "mtp" or (forgot and all(forgot))  # drafts that no longer follow tokens
    assert_pools_empty(engine)


def test_an_mtp_engines_steps_without_drafts_are_plain_steps():
    """A step above `max_batch_size` runs the plain step (`NoDeviceDrafts`): the target's pools
    change, the head's KV pool does not, so it costs what a plain engine's step costs. Steps that
    draft, once one request is left, write the head's KV again, and every token is the naive
    loop's (the head's cache skipped the undrafted tokens, which can only cost acceptance)."""
    family, prompts, lengths = "nemotron_h", [[3, 4, 3, 4], [7, 8, 9], [5, 6, 5]], [3, 5, 20]
    engine = spec_engine(family, "mtp", 2, max_batch_size=1, async_scheduling=True)
    num_layers = model_and_runner(family)[0].config.num_layers
    runner, dispatch = engine.runner, engine.runner.dispatch
    changed = []  # per dispatched step: (whether it drafted, whether the head's pool changed)

    def pools(first: int, stop: int | None) -> list[np.ndarray]:
        return [np.asarray(a) for a in jax.tree.leaves(runner.caches[first:stop])]

    def differ(before: list[np.ndarray], after: list[np.ndarray]) -> bool:
        return any(not np.array_equal(x, y) for x, y in zip(before, after, strict=True))

    def logged(bucket, batches, **options):
        head, target = pools(num_layers, None), pools(0, num_layers)
        step = dispatch(bucket, batches, **options)
        assert differ(target, pools(0, num_layers))
        changed.append((options["drafts"], differ(head, pools(num_layers, None))))
        return step

    runner.dispatch = logged
    assert_serves_naive_greedy(engine, family, prompts, lengths)
    assert (False, False) in changed and (True, True) in changed
    assert (False, True) not in changed, changed


def test_async_scheduling_is_a_flag():
    with pytest.raises(ValueError, match="async_scheduling=1 must be True or False"):
        EngineArgs(async_scheduling=1)
    with pytest.raises(ValueError, match="max_batch_size=2 needs method 'ngram' or 'mtp'"):
        EngineArgs(speculative={"method": "draft_model", "max_batch_size": 2})


def decode_batch_with_one_live_row():
    """A 2-row decode bucket whose row 0 is live (one lane); row 1 is padding."""
    bucket = Bucket(num_decode_rows=2, width=1, num_prefill_tokens=0, num_prefill_rows=0)
    batch = build_dummy(bucket, max_blocks=4)
    batch.inputs.decode.query_lens[0] = 1
    return batch


@pytest.mark.parametrize(
    ("lane", "source", "token"),
    [(1, 3, 0), (0, 9, 0), (0, 1, 5)],
    ids=["padding row", "past the carried tokens", "token id not NULL"],
)
def test_validation_refuses_a_token_source_that_is_not_a_live_decode_lanes(lane, source, token):
    batch = decode_batch_with_one_live_row()
    batch.token_sources[0] = 3
    batch.validate_token_sources(num_carried=8)  # the live lane takes row 2's token: valid
    batch.token_sources[lane], batch.inputs.token_ids[lane] = source, token
    with pytest.raises(ValueError, match="must be a live decode lane's, in 1..8"):
        batch.validate_token_sources(num_carried=8)


def test_warmup_is_refused_while_a_step_is_in_flight():
    """Warm-up runs dummy steps, whose tokens would replace the in-flight step's on the device."""
    engine = make_engine("mamba2", async_scheduling=True)
    engine.add_request([1, 2, 3], SamplingParams(max_tokens=3))
    engine.step()
    with pytest.raises(RuntimeError, match="dispatched step is not retired"):
        engine.warmup()
    while engine.has_unfinished:
        engine.step()
    engine.warmup()


def test_synchronous_and_asynchronous_engines_run_the_same_programs():
    """A synchronous engine warmed with every variant: an asynchronous engine on the same runner
    then compiles nothing (one program serves both schedulings), and both give the naive
    loop's tokens."""
    model, _ = model_and_runner("mamba2")
    config = base_config("mamba2")
    runner = ModelRunner(model, resolve_config(model, config))
    prompt = [1, 2, 3]
    for async_scheduling in (False, True):
        asynchronous = dataclasses.replace(config, async_scheduling=async_scheduling)
        engine = Engine(model, asynchronous, runner=runner)
        if not async_scheduling:
            engine.warmup(prefill=True)
        warmed = set(runner.variants)
        engine.add_request(prompt, SamplingParams(max_tokens=3), request_id="r")
        outputs = {}
        while engine.has_unfinished:
            outputs |= {o.request_id: o for o in engine.step()}
        assert set(runner.variants) == warmed, async_scheduling
        assert outputs["r"].token_ids == naive_greedy("mamba2", prompt, 3), async_scheduling


def test_warmup_with_sampling_covers_a_sampled_request_arriving_at_an_idle_engine():
    """What a server warms (`prefill="alone"`, `sampled=True`, several variants compiling at
    once): greedy and sampled variants of every warmed bucket, so a temperature-1 request (an
    OpenAI client's default) arriving at the idle engine compiles nothing."""
    model, _ = model_and_runner("mamba2")
    config = dataclasses.replace(base_config("mamba2"), async_scheduling=True)
    engine = Engine(model, config, runner=ModelRunner(model, resolve_config(model, config)))
    engine.warmup(prefill="alone", sampled=True)
    warmed = set(engine.runner.variants)
    buckets = engine.buckets.warmup_buckets("alone")
    assert {(v.bucket, v.mode.sampled) for v in warmed} == {
        (bucket, sampled) for bucket in buckets for sampled in (False, True)
    }
    assert engine.runner.compile_seconds.keys() == warmed
    engine.add_request([1, 2, 3, 4, 5], SamplingParams(max_tokens=4, temperature=1.0, seed=3))
    while engine.has_unfinished:
        engine.step()
    assert set(engine.runner.variants) == warmed


PENALIZED = (  # each penalized greedy request's tokens differ from its unpenalized ones
    SamplingParams(max_tokens=10, ignore_eos=True, frequency_penalty=-2.0, repetition_penalty=1.8),
    SamplingParams(max_tokens=10, ignore_eos=True, presence_penalty=-2.0, frequency_penalty=0.7),
    SamplingParams(max_tokens=6, ignore_eos=True),  # no penalties, in penalized steps
    SamplingParams(
        max_tokens=9,
        ignore_eos=True,
        presence_penalty=1.0,
        frequency_penalty=0.5,
        repetition_penalty=1.5,
    ),
    SamplingParams(max_tokens=12, temperature=0.9, seed=5, presence_penalty=2.0, logprobs=1),
)


def naive_penalized_greedy(prompt: list[int], params: SamplingParams) -> list[int]:
    """Greedy tokens of mamba2 by full recompute, each step's logits penalized from the
    definitions (test_penalties.reference_logits) by the prompt and the outputs so far."""
    tokens = list(prompt)
    for _ in range(params.max_tokens):
        logits = reference_logits(
            naive_logits("mamba2", tokens),
            prompt,
            tokens[len(prompt) :],
            params.presence_penalty,
            params.frequency_penalty,
            params.repetition_penalty,
        )
        tokens.append(int(np.argmax(logits)))
    return tokens[len(prompt) :]


def test_penalized_tokens_equal_a_full_recompute_loop_with_and_without_async():
    """Greedy requests with penalties (and one without, in the same steps) get the tokens of a
    penalized full-recompute loop, synchronously and asynchronously (where each decode row's
    newest output is still on the device when its step is built); a sampled penalized request
    gets the same tokens and logprobs both ways."""
    rng = np.random.default_rng(3)
    prompts = [rng.integers(0, 256, n).tolist() for n in (6, 9, 4, 11, 2)]
    outputs = {}
    for async_scheduling in (False, True):
        engine = text_engine("mamba2", async_scheduling)
        for i, (prompt, params) in enumerate(zip(prompts, PENALIZED, strict=True)):
            engine.add_request(prompt, params, request_id=i)
        outputs[async_scheduling] = {}
        while engine.has_unfinished:
            outputs[async_scheduling] |= {o.request_id: o for o in engine.step()}
        variants = engine.runner.variants  # the module's runner: other tests' variants too
        assert {v.mode.penalty_width for v in variants} >= {32}
    for i in range(4):
        want = naive_penalized_greedy(prompts[i], PENALIZED[i])
        assert outputs[False][str(i)].token_ids == outputs[True][str(i)].token_ids == want, i
        unpenalized = naive_greedy("mamba2", prompts[i], PENALIZED[i].max_tokens, stop_ids=())
        assert (want == unpenalized) == (i == 2), i  # the penalties bite where they are asked
    sampled = outputs[False]["4"], outputs[True]["4"]
    assert sampled[0].token_ids == sampled[1].token_ids
    assert_logprobs_close(sampled[1].logprobs, sampled[0].logprobs)
    tokens = sampled[0].token_ids
    for t, token in enumerate(tokens):  # logprobs are the raw distribution's, unpenalized
        logits = naive_logits("mamba2", prompts[4] + tokens[:t])
        raw = logits[token] - logits.max() - np.log(np.exp(logits - logits.max()).sum())
        assert abs(sampled[0].logprobs[t][token] - raw) < 1e-4, t
