"""The real draft-model drafter with prefix caching ("align" and "all"): when the target starts a
request after a cached prefix (a repeated prompt, a shared prefix, a chat's next turn, a
preempted request coming back), the draft model first prefills the skipped tokens (fill passes)
and then drafts as usual.

The draft model is the target itself: a draft model whose state followed the target's exactly
proposes the target's own greedy tokens, so every draft must be accepted (a fill pass that
started from the wrong state, or skipped a token, shows as a rejection), and the greedy tokens
must equal full recompute without speculation and without caching. Before the fill passes, the
first hit crashed the step ("draft model at token 0, chunk at N").
"""

from __future__ import annotations

import pytest

from runtime.core.speculative_config import SpeculativeConfig
from runtime.device.memory import resolve_config
from runtime.device.model_runner import ModelRunner
from runtime.engine import Engine
from runtime.speculative.draft_model import draft_engine_args
from tests.compiled import per_module
from tests.runtime.conftest import FAMILIES, model_and_runner
from tests.runtime.prefix_cache.test_prefix_caching import (
    MAX_CACHED,
    MAX_NUM_SEQS,
    MODES,
    SETUPS,
    assert_lossless,
    prefix_config,
    serve,
    tokens,
)
from tests.tiers import quick_first

K = 3
SLOTS = 1 + MAX_NUM_SEQS * (2 + K) + MAX_CACHED


def draft_prefix_config(family: str, mode: str, **options):
    speculative = SpeculativeConfig("draft_model", K)
    return prefix_config(family, mode, num_slots=SLOTS, speculative=speculative, **options)


@per_module
def runners(family: str) -> tuple[ModelRunner, ModelRunner]:
    """The target's runner and the draft model's (the target's model), shared by both modes."""
    model, _ = model_and_runner(family)
    config = draft_prefix_config(family, "all")
    target = resolve_config(model, config)
    draft = resolve_config(model, draft_engine_args(target))
    return ModelRunner(model, target), ModelRunner(model, draft)


def draft_engine(family: str, mode: str, **options) -> Engine:
    model, _ = model_and_runner(family)
    target, draft = runners(family)
    config = draft_prefix_config(family, mode, **options)
    return Engine(model, config, runner=target, draft_model=model, draft_runner=draft)


def assert_every_draft_accepted(engine: Engine) -> None:
    spec = engine.stats.speculation
    assert spec.num_drafted > 0 and spec.num_accepted == spec.num_drafted, spec


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("family", quick_first(FAMILIES))
def test_repeated_prompts_and_shared_prefixes_are_lossless(family, mode):
    """A prompt, then the same prompt again (it starts at its last state block boundary); then
    six requests, two on each of three shared 97-token prefixes, the second arriving after the
    first one's prefill (it starts after the shared prefix)."""
    sbs = SETUPS[family].state_block
    engine = draft_engine(family, mode, max_cached_states=2)
    prompt = [(0, tokens(9, 2 * sbs + 5), 12)]
    first, again = serve(engine, prompt), serve(engine, prompt)
    assert_lossless(family, prompt, first)
    assert_lossless(family, prompt, again)
    assert (first["0"].num_cached_tokens, again["0"].num_cached_tokens) == (0, 2 * sbs)
    prefixes = [tokens(10 + k, 97) for k in range(3)]
    plan = [(0, 0), (0, 1), (4, 0), (4, 1), (5, 2), (9, 2)]  # (arrival step, prefix)
    arrivals = [(t, prefixes[k] + tokens(20 + i, 6), 12) for i, (t, k) in enumerate(plan)]
    outputs = serve(engine, arrivals)
    assert_lossless(family, arrivals, outputs)
    assert sum(o.num_cached_tokens > 0 for o in outputs.values()) >= 2
    assert_every_draft_accepted(engine)


@pytest.mark.parametrize("mode", MODES)
def test_a_preempted_request_returns_to_its_own_cached_prefix(mode):
    """Four 100-token prompts of 24 tokens each at once on 39 KV blocks (16 per request): the
    youngest is preempted, and its recompute starts after the prefix it cached itself (NemotronH,
    attention + Mamba2, is the family whose tiny pools make that happen deterministically)."""
    family = "nemotron_h"
    engine = draft_engine(family, mode)
    arrivals = [(0, tokens(40 + i, 100), 24) for i in range(4)]
    outputs = serve(engine, arrivals)
    assert_lossless(family, arrivals, outputs)
    assert any(o.num_preemptions and o.num_cached_tokens for o in outputs.values()), outputs
    assert_every_draft_accepted(engine)


@pytest.mark.parametrize("family", quick_first(FAMILIES))
def test_a_chat_turn_hits_the_answer_drafted_before(family):
    """Turn 2 = turn 1's prompt + its drafted answer + a question: "all" caches the state the
    answer's decode crossed, so turn 2 starts inside turn 1's answer."""
    sbs, _ = SETUPS[family]
    engine = draft_engine(family, "all")
    first = tokens(30, 2 * sbs - 3)
    turn1 = serve(engine, [(0, first, 8)])
    second = first + turn1["0"].token_ids + tokens(31, 5)
    turn2 = serve(engine, [(0, second, 6)])
    assert_lossless(family, [(0, first, 8)], turn1)
    assert_lossless(family, [(0, second, 6)], turn2)
    assert turn2["0"].num_cached_tokens == 2 * sbs
    assert_every_draft_accepted(engine)
