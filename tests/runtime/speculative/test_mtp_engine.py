"""Speculative decoding with the model's MTP head (method "mtp"): lossless and hit-preserving.

The tiny presets get an MTP head (Qwen3-Next: an attention layer with the model's MoE; NemotronH:
an attention block then an MLP block). The head's parameters are drawn after the model's, so the
target is the preset's model itself, and greedy output must equal `naive_greedy` (full recompute
of the preset model, which has no head) under preemption, prefix caching "align" and "all" with
shared prefixes and repeated prompts. A repeated prompt hits on its first repeat with drafts on,
as often as without them. The heads are random, so their drafts are rejected:
tests/jmamba/test_mtp.py checks drafting after accepted lanes against the reference, and
test_mtp_preset.py serves the trained NemotronH head of `tiny-stdlib` (drafts accepted). One
runner per prefix mode; CI time about 30 s.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from hypothesis import event, given, settings
from hypothesis import strategies as st

from runtime.core.speculative_config import SpeculativeConfig
from runtime.device.memory import resolve_config
from runtime.device.model_runner import ModelRunner
from runtime.engine import Engine
from tests.compiled import per_module
from tests.runtime.conftest import base_config, model_and_runner
from tests.runtime.prefix_cache.test_prefix_caching import (
    MAX_CACHED,
    MAX_NUM_SEQS,
    assert_lossless,
    prefix_config,
    serve,
    serve_and_check_with_aborts,
    shared_prefix_arrivals,
    tokens,
)
from tests.runtime.speculative.spec_support import CoinGate, mtp_model
from tests.runtime.speculative.test_speculative_prefix import (
    request_strategy as prefix_request_strategy,
)
from tests.tiers import quick_first, slow

K = 3
FAMILIES = ("nemotron_h", "qwen3_next")
SLOTS = 1 + MAX_NUM_SEQS * (2 + K) + MAX_CACHED  # per request its slot and 1 + K lane slots


def mtp_config(family: str, mode: str, k: int = K):
    speculative = SpeculativeConfig("mtp", k)
    if mode == "off":  # the shared small pools: requests preempt each other
        return dataclasses.replace(base_config(family), num_slots=SLOTS, speculative=speculative)
    return prefix_config(family, mode, num_slots=SLOTS, speculative=speculative)


@per_module
def mtp_runner(family: str, mode: str) -> ModelRunner:
    model = mtp_model(family)
    return ModelRunner(model, resolve_config(model, mtp_config(family, mode)))


def mtp_engine(family: str, mode: str, async_scheduling: bool = False) -> Engine:
    config = dataclasses.replace(mtp_config(family, mode), async_scheduling=async_scheduling)
    return Engine(mtp_model(family), config, runner=mtp_runner(family, mode))


def test_the_head_is_drawn_after_the_target():
    """The MTP models' targets are the presets' models, so `naive_greedy` is their reference."""
    for family in FAMILIES:
        ours, preset = mtp_model(family), model_and_runner(family)[0]
        np.testing.assert_array_equal(ours.embed[...], preset.embed[...])
        np.testing.assert_array_equal(ours.final_norm.weight[...], preset.final_norm.weight[...])


def arrivals(seed: int) -> list[tuple[int, list[int], int]]:
    """Shared prefixes, a prompt repeated exactly, arrivals over several steps."""
    prefixes = [tokens(seed, 150), tokens(seed + 1, 90)]
    requests = [
        dict(arrival=0, prefix=0, shared=140, own=5, max_tokens=12),
        dict(arrival=0, prefix=1, shared=70, own=9, max_tokens=9),
        dict(arrival=3, prefix=0, shared=140, own=5, max_tokens=12),
        dict(arrival=5, prefix=1, shared=90, own=1, max_tokens=14),
        dict(arrival=9, prefix=0, shared=33, own=20, max_tokens=10),
    ]
    drawn = shared_prefix_arrivals(requests, prefixes, seed)
    return [*drawn, (12, list(drawn[0][1]), 12)]  # request 0's prompt again, once it is cached


@pytest.mark.parametrize(
    ("family", "mode", "async_scheduling"),
    # Synchronous drafting steps with preemption: test_speculative_schedules.py draws them.
    quick_first([("qwen3_next", "off", True), ("qwen3_next", "all", True)]),
)
def test_mtp_greedy_equals_full_recompute(family, mode, async_scheduling):
    """Drafts from the head change no token: preemption ("off": 13 KV blocks for five
    requests), prefix hits ("align", "all"), asynchronous drafting steps (rows scheduled on
    drafts then rejected are dropped: the random head's drafts are), and drafts were proposed
    and verified."""
    engine = mtp_engine(family, mode, async_scheduling)
    cases = arrivals(seed=7) if mode != "off" else [(a, p[:40], n) for a, p, n in arrivals(7)]
    outputs = serve(engine, cases)
    assert_lossless(family, cases, outputs)
    speculation = engine.stats.speculation
    assert speculation.num_drafted > 0
    if mode == "off":
        assert sum(s.num_preemptions for s in engine.schedulers) > 0


# 3 examples in CI (each serves its requests on the qwen3_next tiny model: ~8 s); the "long"
# profile runs 50.
@settings(max_examples=max(settings.default.max_examples // 20, 3))
@given(
    requests=st.lists(prefix_request_strategy, min_size=1, max_size=5),
    seed=st.integers(0, 2**16),
)
def test_random_cached_schedules_with_asynchronous_drafts_are_lossless(requests, seed):
    """Prefix caching "all", asynchronous steps, a gate that drafts in a random half of the
    steps: rows scheduled on the random head's rejected drafts are dropped, one-token rows write
    a last lane in place (which the cache then does not take), shared prefixes hit, aborts and
    preemption land between steps; validate() on every step; every request that was not
    aborted equals full recompute, and the pools hold only the cache's entries at the end."""
    family = "qwen3_next"
    prefixes = [tokens(80 + k, 60) for k in range(2)]
    arrivals = shared_prefix_arrivals(requests, prefixes, seed=90)
    engine = mtp_engine(family, "all", async_scheduling=True)
    engine.gate = CoinGate(seed)
    serve_and_check_with_aborts(engine, family, arrivals, [r["abort_at"] for r in requests])
    spec = engine.stats.speculation
    event("drafted" if spec.num_drafted else "no draft")
    event("preempted" if engine.inspect.scheduler.num_preemptions else "no preemption")
    scheduler = engine.inspect.scheduler
    scheduler.slots.cache.reset()
    assert scheduler.block_pool.num_used == 0 and scheduler.slot_pool.num_used == 0


@slow
def test_a_repeated_prompt_hits_on_its_first_repeat_with_drafts():
    """The prefix cache's hits with MTP drafts equal those without speculation, the exact
    repeat among them."""
    family, cases = "qwen3_next", arrivals(seed=11)
    counts = []
    for speculative in (None, SpeculativeConfig("mtp", K)):
        engine = Engine(
            mtp_model(family),
            dataclasses.replace(mtp_config(family, "all"), speculative=speculative),
            runner=mtp_runner(family, "all") if speculative else None,
        )
        serve(engine, cases)
        stats = engine.stats.prefix_cache
        counts.append((stats.hits, stats.hit_tokens))
    assert counts[0] == counts[1]
    assert counts[0][0] >= 3  # requests 2, 3 and the repeat


def test_a_model_without_a_head_is_refused():
    model, _ = model_and_runner("qwen3_next")
    config = dataclasses.replace(base_config("qwen3_next"), num_slots=SLOTS)
    with pytest.raises(ValueError, match="MTP head"):
        Engine(model, dataclasses.replace(config, speculative=SpeculativeConfig("mtp", K)))


def test_an_engine_that_does_not_draft_with_the_head_leaves_it_out():
    """No parameters and no KV pool for a head the engine does not draft with."""
    model = mtp_model("qwen3_next")
    engine = Engine(model, base_config("qwen3_next"), runner=model_and_runner("qwen3_next")[1])
    assert engine.model_config.mtp_mixers == ()
    runner = ModelRunner(model, resolve_config(model, base_config("qwen3_next")))
    assert len(runner.caches) == model.config.num_layers
    drafting = resolve_config(model, mtp_config("qwen3_next", "off"))
    assert runner.num_params < ModelRunner(model, drafting).num_params
