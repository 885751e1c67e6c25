"""Prefix caching through the model, every family, "align" and "all": lossless and in place.

Lossless: greedy outputs with caching (and hits) equal greedy outputs by full recompute of the
whole sequence from fresh caches (`naive_greedy`, which never sees a cache), for hits at a
boundary inside a chunk, full-prompt hits, hits after preemption, hits under eviction pressure,
a chat whose next prompt holds the previous answer, and hypothesis schedules with aborts.
In place: a published state slot and KV block stay bit-identical while they are published.

One runner per family (3 step variants; "align" and "all" engines share it), validate() with
the published slots and blocks on every step. CI time: about 4 minutes on 2 shared cores
(compiles included).
"""

from __future__ import annotations

import dataclasses
from typing import NamedTuple

import jax
import numpy as np
import pytest
from hypothesis import event, given, settings
from hypothesis import strategies as st

from runtime.core.engine_args import EngineArgs
from runtime.core.sampling_params import SamplingParams
from runtime.device.memory import resolve_config
from runtime.device.model_runner import ModelRunner
from runtime.engine import Engine
from runtime.outputs.request_output import RequestOutput
from tests.compiled import per_module
from tests.runtime.conftest import (
    BLOCK_SIZE,
    DECODE_STEPS,
    FAMILIES,
    assert_greedy,
    model_and_runner,
    naive_greedy,
)
from tests.tiers import quick_first

MAX_LEN, MAX_NUM_SEQS, NUM_BLOCKS, MAX_CACHED = 192, 4, 40, 8
MODES = ("align", "all")


class Setup(NamedTuple):
    state_block: int  # a multiple of the family's chunk size (16, or 64 with Gated DeltaNet)
    budget: int  # tokens per step: a few state blocks, so prompts take several chunks


SETUPS = {"mamba2": Setup(16, 48), "nemotron_h": Setup(16, 48), "qwen3_next": Setup(64, 128)}


def prefix_config(family: str, mode: str = "all", **options) -> EngineArgs:
    """Small pools: 39 KV blocks (a full-length request needs 24) and 8 cached states."""
    setup = SETUPS[family]
    config = EngineArgs(
        max_num_seqs=MAX_NUM_SEQS,
        max_num_batched_tokens=setup.budget,
        max_model_len=MAX_LEN,
        block_size=BLOCK_SIZE,
        num_blocks=NUM_BLOCKS,
        num_slots=MAX_NUM_SEQS + 1 + MAX_CACHED,
        max_cached_states=MAX_CACHED,
        state_block_size=setup.state_block,
        prefix_caching=mode,
        decode_row_buckets=(MAX_NUM_SEQS,),
        prefill_token_buckets=(setup.budget,),
        prefill_row_buckets=(MAX_NUM_SEQS,),
        validate_inputs=True,
    )
    return dataclasses.replace(config, **options)


@per_module
def prefix_runner(family: str) -> ModelRunner:
    model, _ = model_and_runner(family)
    return ModelRunner(model, resolve_config(model, prefix_config(family)))


def prefix_engine(family: str, mode: str, **options) -> Engine:
    """A fresh engine (fresh scheduler, pools and prefix cache) on the family's shared runner."""
    model, _ = model_and_runner(family)
    return Engine(model, prefix_config(family, mode, **options), runner=prefix_runner(family))


def serve(engine: Engine, arrivals: list[tuple[int, list[int], int]]) -> dict[str, RequestOutput]:
    """(arrival step, prompt, max_tokens) per request, ids '0', '1', ...; run to completion."""
    outputs: dict[str, RequestOutput] = {}
    step = 0
    while step <= max(a for a, _, _ in arrivals) or engine.has_unfinished:
        for i, (arrival, prompt, max_tokens) in enumerate(arrivals):
            if arrival == step:
                engine.add_request(prompt, SamplingParams(max_tokens=max_tokens), request_id=i)
        outputs |= {o.request_id: o for o in engine.step()}
        step += 1
        assert step < 1000
    return outputs


@per_module
def reference(family: str, prompt: tuple[int, ...], max_tokens: int) -> list[int]:
    return naive_greedy(family, list(prompt), max_tokens, max_len=MAX_LEN)


def assert_lossless(family: str, arrivals, outputs: dict[str, RequestOutput]) -> None:
    """Every request's tokens are full recompute's (`assert_greedy`: up to a tie)."""
    for i, (_, prompt, max_tokens) in enumerate(arrivals):
        assert_greedy(family, list(prompt), outputs[str(i)].token_ids, max_tokens, MAX_LEN)


def tokens(seed: int, n: int) -> list[int]:
    return np.random.default_rng(seed).integers(3, 256, n).tolist()  # no EOS (2) in prompts


def shared_prefix_arrivals(requests: list[dict], prefixes: list[list[int]], seed: int) -> list:
    """(arrival, prompt, max_tokens) per drawn request: part of a shared prefix + its own tokens."""
    return [
        (
            r["arrival"],
            prefixes[r["prefix"]][: r["shared"]] + tokens(seed + i, r["own"]),
            r["max_tokens"],
        )
        for i, r in enumerate(requests)
    ]


def serve_and_check_with_aborts(engine: Engine, family: str, arrivals, abort_at) -> None:
    """Serve `arrivals`, aborting request i at step abort_at[i] (None: never); every request
    that was not aborted must equal full recompute (`assert_greedy`: up to a tie)."""
    outputs, aborted, step = {}, set(), 0
    last = max([a for a, _, _ in arrivals] + [s for s in abort_at if s is not None])
    while step <= last or engine.has_unfinished:
        for i, (arrival, prompt, n) in enumerate(arrivals):
            if arrival == step:
                engine.add_request(prompt, SamplingParams(max_tokens=n), request_id=i)
            if abort_at[i] == step and engine.abort(i) is not None:
                aborted.add(str(i))
        outputs |= {o.request_id: o for o in engine.step()}
        step += 1
        assert step < 500
    for i, (_, prompt, n) in enumerate(arrivals):
        if str(i) not in aborted:
            assert_greedy(family, list(prompt), outputs[str(i)].token_ids, n, MAX_LEN)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("family", quick_first(FAMILIES))
def test_hits_inside_a_chunk_and_full_prompt_hits_are_lossless(family, mode):
    """A = (budget - 1 state block + half a block) shared tokens + its own, then B (the shared
    part + other tokens) and C (A again) together. "all": B starts at budget - 1 state block, a
    boundary inside A's first chunk; C starts at A's last token (a full-prompt hit: A is a
    multiple of the state block + 1 long). "align": C's full-prompt hit only (a chunk end of A;
    B's shared part ends before A's first chunk end)."""
    sbs, budget = SETUPS[family]
    inside = budget - sbs  # a state block boundary strictly inside A's first chunk [0, budget)
    shared = tokens(1, inside + sbs // 2)
    full = budget + 1
    a = shared + tokens(2, full - len(shared))
    b = shared + tokens(3, 9)
    arrivals = [(0, a, 5), (12, b, 5), (12, list(a), 5)]
    outputs = serve(prefix_engine(family, mode), arrivals)
    assert_lossless(family, arrivals, outputs)
    assert outputs["2"].num_cached_tokens == full - 1
    assert outputs["1"].num_cached_tokens == (inside if mode == "all" else 0)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("family", quick_first(FAMILIES))
def test_hits_after_preemption_and_under_eviction_pressure_are_lossless(family, mode):
    """Six requests of 103 + 12 tokens, two on each of three shared 97-token prefixes (the second
    arriving after the first one's prefill): 39 KV blocks for up to 4 running requests of 15
    blocks each (preemption, block evictions; a model without attention has no blocks to run out
    of) and 2 cached states (state evictions)."""
    prefixes = [tokens(10 + k, 97) for k in range(3)]
    plan = [(0, 0), (0, 1), (4, 0), (4, 1), (5, 2), (9, 2)]  # (arrival step, prefix)
    arrivals = [(t, prefixes[k] + tokens(20 + i, 6), 12) for i, (t, k) in enumerate(plan)]
    engine = prefix_engine(family, mode, max_cached_states=2)
    outputs = serve(engine, arrivals)
    assert_lossless(family, arrivals, outputs)
    stats = engine.stats.ranks[0].prefix_cache
    assert stats.hits and stats.state_evictions, stats
    if engine.model_config.has_attention:
        assert engine.inspect.scheduler.num_preemptions and stats.block_evictions, stats
        assert any(o.num_preemptions and o.num_cached_tokens for o in outputs.values())


@pytest.mark.parametrize(
    ("mode", "async_scheduling", "decode_steps"),
    [*((m, False, 1) for m in MODES), ("all", True, 1), ("all", False, 4), ("all", True, 4)],
)
@pytest.mark.parametrize("family", quick_first(FAMILIES))
def test_a_chat_hits_its_previous_answer_in_all_mode(family, mode, async_scheduling, decode_steps):
    """Turn 1's prompt ends 3 tokens before a state block boundary and its 8-token answer is
    decoded across it; turn 2's prompt is turn 1's prompt + answer + a question. "all" caches the
    state the crossing decode step wrote, so turn 2 starts past turn 1's prompt, also when that
    step was scheduled before the token it fed was on the host (asynchronous, or inside a
    program of several decode steps: the state is keyed when the step retires); "align" starts
    at most at turn 1's last chunk end."""
    sbs, _ = SETUPS[family]
    engine = prefix_engine(
        family, mode, async_scheduling=async_scheduling, decode_steps=decode_steps
    )
    first = tokens(30, 2 * sbs - 3)
    turn1 = serve(engine, [(0, first, 8)])["0"]
    second = first + turn1.token_ids + tokens(31, 5)
    outputs = serve(engine, [(0, second, 6)])
    assert_lossless(family, [(0, first, 8)], {"0": turn1})
    assert_lossless(family, [(0, second, 6)], outputs)
    assert len(turn1.token_ids) == 8  # the answer crossed the boundary at 2 * sbs
    hit = outputs["0"].num_cached_tokens
    assert hit == 2 * sbs if mode == "all" else hit <= len(first) // sbs * sbs


def published_contents(engine: Engine) -> dict[tuple[str, int], list[np.ndarray]]:
    """Every published state slot's and KV block's contents in every layer, read back."""
    cache, caches = engine.inspect.scheduler.slots.cache, engine.runner.caches
    entries = {}
    for kind, ids in (("slot", cache.published_slots), ("block", cache.published_blocks)):
        for ident in ids.tolist():
            rows = []
            for layer in caches:
                if layer is None or (kind == "block") != (type(layer).__name__ == "KVCache"):
                    continue
                rows += [np.asarray(leaf[ident]) for leaf in jax.tree.leaves(layer)]
            entries[kind, ident] = rows
    return entries


@pytest.mark.parametrize("family", quick_first(FAMILIES))
def test_published_slots_and_blocks_stay_bit_identical_while_published(family):
    """After every step, each entry that was published before it and still is holds the same bits
    (requests hitting it read it, prefills and decodes around it write other slots)."""
    sbs, _ = SETUPS[family]
    engine = prefix_engine(family, "all")
    shared = tokens(40, 2 * sbs + 3)
    arrivals = [
        (0, shared + tokens(41, 4), 6),
        (6, shared + tokens(42, 9), 6),
        (6, shared + tokens(43, 2), 6),
        (7, tokens(44, sbs + 5), 6),
    ]
    before: dict = {}
    step, checked = 0, 0
    while step <= 7 or engine.has_unfinished:
        for i, (arrival, prompt, n) in enumerate(arrivals):
            if arrival == step:
                engine.add_request(prompt, SamplingParams(max_tokens=n), request_id=i)
        engine.step()
        now = published_contents(engine)
        for key in before.keys() & now.keys():
            for old, new in zip(before[key], now[key], strict=True):
                np.testing.assert_array_equal(old, new, err_msg=str(key))
            checked += 1
        before = now
        step += 1
    assert checked > 20 and engine.stats.ranks[0].prefix_cache.hits >= 2


request_strategy = st.fixed_dictionaries(
    {
        "prefix": st.integers(0, 2),  # which shared prefix
        "shared": st.sampled_from([70, 90, 100]) | st.integers(0, 100),  # how much of it
        "own": st.integers(1, 60),
        "max_tokens": st.integers(1, 8),
        "arrival": st.integers(0, 8),
        "abort_at": st.none() | st.integers(0, 10),
    }
)


@settings(max_examples=max(settings.default.max_examples // 5, 3))
@pytest.mark.parametrize("family", quick_first(FAMILIES))
@given(
    requests=st.lists(request_strategy, min_size=1, max_size=6),
    mode=st.sampled_from(MODES),
    max_cached_states=st.integers(1, MAX_CACHED),
    async_scheduling=st.booleans(),
    decode_steps=st.sampled_from(DECODE_STEPS),
)
def test_random_shared_prefix_schedules_are_lossless(
    family, requests, mode, max_cached_states, async_scheduling, decode_steps
):
    """Shared prefixes of random lengths, arrivals, aborts, preemption (39 blocks), with and
    without asynchronous scheduling, one or several decode steps a program: validate() on every
    step, every request that was not aborted equals full recompute, and every pool holds only
    the cache's entries at the end."""
    prefixes = [tokens(50 + k, 100) for k in range(3)]
    arrivals = shared_prefix_arrivals(requests, prefixes, seed=60)
    engine = prefix_engine(
        family,
        mode,
        max_cached_states=max_cached_states,
        async_scheduling=async_scheduling,
        decode_steps=decode_steps,
    )
    serve_and_check_with_aborts(engine, family, arrivals, [r["abort_at"] for r in requests])
    event("hit" if engine.stats.ranks[0].prefix_cache.hits else "no hit")
    event("preempted" if engine.inspect.scheduler.num_preemptions else "no preemption")
    scheduler = engine.inspect.scheduler
    scheduler.slots.cache.reset()
    assert scheduler.block_pool.num_used == 0 and scheduler.slot_pool.num_used == 0
