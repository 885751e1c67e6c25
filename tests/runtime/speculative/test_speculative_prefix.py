"""Speculative decoding with prefix caching "all": an accepted lane that ends on a state block
boundary publishes its slot (no copy), a rejected lane publishes nothing, and everything stays
lossless against full recompute.

The drafter is the `Oracle` of spec_support (it knows each request's greedy continuation and
proposes it with planned mistakes), so every step mixes accepted and rejected lanes. One runner
per family (speculative lanes and prefill boundary slots in one layout). CI time: about a minute
on 2 shared cores.
"""

from __future__ import annotations

import jax
import numpy as np
import pytest
from hypothesis import event, given
from hypothesis import strategies as st

from runtime.core.speculative_config import SpeculativeConfig
from runtime.device.memory import resolve_config
from runtime.device.model_runner import ModelRunner
from runtime.engine import Engine
from tests.compiled import per_module
from tests.runtime.conftest import FAMILIES, model_and_runner
from tests.runtime.prefix_cache.test_prefix_caching import (
    MAX_CACHED,
    MAX_NUM_SEQS,
    SETUPS,
    prefix_config,
    prefix_engine,
    reference,
    serve,
    serve_and_check_with_aborts,
    shared_prefix_arrivals,
    tokens,
)
from tests.runtime.speculative.spec_support import Oracle
from tests.tiers import quick_first

K = 3
SPEC_PREFIX_SLOTS = 1 + MAX_NUM_SEQS * (2 + K) + MAX_CACHED


def spec_prefix_config(family: str, **options):
    speculative = SpeculativeConfig("ngram", K, prompt_lookup_min=1, prompt_lookup_max=3)
    return prefix_config(
        family, "all", num_slots=SPEC_PREFIX_SLOTS, speculative=speculative, **options
    )


@per_module
def spec_prefix_runner(family: str) -> ModelRunner:
    model, _ = model_and_runner(family)
    return ModelRunner(model, resolve_config(model, spec_prefix_config(family)))


def oracle_engine(family: str, arrivals, seed: int = 0, **options) -> Engine:
    """A fresh speculative "all" engine whose drafter proposes each request's true greedy
    continuation (arrivals as in `serve`), with planned mistakes."""
    model, _ = model_and_runner(family)
    engine = Engine(model, spec_prefix_config(family, **options), runner=spec_prefix_runner(family))
    truth = {str(i): reference(family, tuple(p), n) for i, (_, p, n) in enumerate(arrivals)}
    engine.drafter = Oracle(truth, K, seed=seed)
    return engine


@pytest.mark.parametrize("family", quick_first(FAMILIES))
def test_a_chat_hits_the_boundary_state_an_accepted_lane_published(family):
    """Turn 1's prompt ends 3 tokens before a state block boundary and its 12-token answer is
    decoded across it with drafts (accepted lanes cover every position once, so some accepted
    lane ends on the boundary); turn 2 = turn 1 + answer + a question starts at the boundary."""
    sbs, _ = SETUPS[family]
    first = tokens(30, 2 * sbs - 3)
    turn1 = [(0, first, 12)]
    engine = oracle_engine(family, turn1, seed=4)  # a plan with mistakes and long accepts
    answer = serve(engine, turn1)["0"].token_ids
    assert answer == reference(family, tuple(first), 12)
    spec = engine.stats.speculation
    assert 0 < spec.num_accepted < spec.num_drafted  # accepted and rejected lanes both ran
    turn2 = [(0, first + answer + tokens(31, 5), 6)]
    engine.drafter = Oracle({"0": reference(family, tuple(turn2[0][1]), 6)}, K, seed=2)
    outputs = serve(engine, turn2)
    assert outputs["0"].token_ids == reference(family, tuple(turn2[0][1]), 6)
    assert outputs["0"].num_cached_tokens == 2 * sbs


def published_states(engine: Engine) -> dict[bytes, list[np.ndarray]]:
    """Key -> the published state's rows in every recurrent layer, read back from the device."""
    cache, caches = engine.inspect.scheduler.slots.cache, engine.runner.caches
    layers = [layer for layer in caches if layer is not None and type(layer).__name__ != "KVCache"]
    return {
        key: [np.asarray(leaf[slot]) for layer in layers for leaf in jax.tree.leaves(layer)]
        for key, slot in cache.published_states.items()
    }


@pytest.mark.parametrize("family", ["nemotron_h", "qwen3_next"])
def test_lane_states_published_equal_those_decoded_one_token_at_a_time(family):
    """Every state that accepted lanes published equals (to float32 rounding) the one a plain
    "all" engine without drafts publishes for the same key: a rejected lane (a state after a
    wrong token) published in its place would differ by far more."""
    sbs, _ = SETUPS[family]
    arrivals = [(0, tokens(70, sbs - 2), 2 * sbs + 4), (1, tokens(71, 5), 2 * sbs)]
    spec = oracle_engine(family, arrivals, seed=3)
    plain = prefix_engine(family, "all")
    for engine in (spec, plain):
        serve(engine, arrivals)
    ours, theirs = published_states(spec), published_states(plain)
    assert len(theirs) >= 2 and ours.keys() == theirs.keys(), (len(ours), len(theirs))
    for key in theirs:
        for a, b in zip(ours[key], theirs[key], strict=True):
            np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)


request_strategy = st.fixed_dictionaries(
    {
        "prefix": st.integers(0, 1),
        "shared": st.sampled_from([40, 60]) | st.integers(0, 60),
        "own": st.integers(1, 50),
        "max_tokens": st.integers(1, 40),
        "arrival": st.integers(0, 3),
        "abort_at": st.none() | st.integers(0, 12),
    }
)


@given(
    requests=st.lists(request_strategy, min_size=1, max_size=6),
    max_cached_states=st.integers(1, MAX_CACHED),
    seed=st.integers(0, 2**16),
)
def test_random_shared_prefix_schedules_with_drafts_are_lossless(requests, max_cached_states, seed):
    """nemotron_h (KV blocks and state slots): shared prefixes of random lengths, arrivals,
    aborts, preemption in the middle of speculation (39 KV blocks, requests of up to 19),
    drafts with mistakes; validate() with the published slots on every step; every request that
    was not aborted equals full recompute; every pool holds only the cache's entries at the
    end."""
    family = "nemotron_h"
    prefixes = [tokens(80 + k, 60) for k in range(2)]
    arrivals = shared_prefix_arrivals(requests, prefixes, seed=90)
    engine = oracle_engine(family, arrivals, seed=seed, max_cached_states=max_cached_states)
    serve_and_check_with_aborts(engine, family, arrivals, [r["abort_at"] for r in requests])
    cache_stats, spec = engine.stats.ranks[0].prefix_cache, engine.stats.speculation
    event("hit" if cache_stats.hits else "no hit")
    event("preempted" if engine.inspect.scheduler.num_preemptions else "no preemption")
    event("rejections" if spec.num_accepted < spec.num_drafted else "no rejection")
    scheduler = engine.inspect.scheduler
    scheduler.slots.cache.reset()
    assert scheduler.block_pool.num_used == 0 and scheduler.slot_pool.num_used == 0
