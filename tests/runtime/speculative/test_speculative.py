"""Speculative decoding end to end: the tokens equal those without drafts, for every family,
both drafters and a planned-mistakes oracle, K = 1..4, with decode rows beside prefill rows and
preemption; the draft model equal to the target accepts every draft; sampled requests get the
same tokens with and without drafts; stop rules cut multi-token steps exactly."""

from __future__ import annotations

import numpy as np
import pytest

from runtime.core.sampling_params import SamplingParams
from tests.runtime.conftest import FAMILIES, naive_greedy, run_to_completion
from tests.runtime.speculative.spec_support import Oracle, spec_engine, trained_engine
from tests.tiers import quick_first, slow, slow_cases

PROMPT_LENS = (1, 13, 37, 20)
MAX_TOKENS = 10


def distinct_prompts(seed: int) -> list[list[int]]:
    """Prompts of distinct random tokens, of the lengths PROMPT_LENS: a random model's next token
    is often somewhere in them, so 1-gram lookup proposes (and is mostly wrong)."""
    rng = np.random.default_rng(seed)
    return [rng.permutation(256)[:n].tolist() for n in PROMPT_LENS]


def serve(engine, prompts, params, late: int = 2) -> dict[str, list[int]]:
    """The first two prompts now, the rest after `late` steps: new prefills beside decodes."""
    ids = [engine.add_request(p, params) for p in prompts[:2]]
    outputs = {}
    for _ in range(late):
        outputs |= {o.request_id: o.token_ids for o in engine.step()}
    ids += [engine.add_request(p, params) for p in prompts[2:]]
    outputs |= run_to_completion(engine)
    return {i: outputs[i] for i in ids}


def assert_pools_empty(engine) -> None:
    assert (
        engine.inspect.scheduler.block_pool.num_used == 0
        and engine.inspect.scheduler.slot_pool.num_used == 0
    )
    for rank in getattr(engine.drafter, "ranks", []):
        assert rank.block_pool.num_used == 0 and rank.slot_pool.num_used == 0


def mixed_steps(engine, prompts, params) -> tuple[dict[str, list[int]], int]:
    """Serve, counting steps with draft lanes and a prefill row in one batch."""
    mixed = 0
    step = engine.step

    def counting_step():
        nonlocal mixed
        finished = step()
        schedule = engine.inspect.last_schedule
        if schedule and schedule.prefills and any(d.num_tokens > 1 for d in schedule.decodes):
            mixed += 1
        return finished

    engine.step = counting_step
    return serve(engine, prompts, params), mixed


# (family, method, K): every family with the draft-model drafter, the ngram drafter on the two
# Mamba2 families (qwen3_next's partial acceptance is driven by its draft model here and by the
# random schedules with drafts; 30 s of CI), K = 1..4 across them; the oracle (every draft right)
# once: test_draft_model_equal_to_target_accepts_every_draft drives full acceptance on every
# family.
CASES = [
    ("mamba2", "ngram", 1),
    ("mamba2", "draft_model", 3),
    ("nemotron_h", "ngram", 2),
    ("nemotron_h", "draft_model", 1),
    ("qwen3_next", "oracle", 1),
    ("qwen3_next", "draft_model", 4),
]


@pytest.mark.parametrize(
    ("family", "method", "k"),
    slow_cases(CASES, quick=[("mamba2", "ngram", 1), ("mamba2", "draft_model", 3)]),
)
def test_greedy_with_drafts_equals_full_recompute(family, method, k):
    prompts = distinct_prompts(3)
    truth = {str(i): naive_greedy(family, p, MAX_TOKENS) for i, p in enumerate(prompts)}
    engine = spec_engine(family, "ngram" if method == "oracle" else method, k)
    if method == "oracle":
        engine.drafter = Oracle(truth, k)
    outputs, mixed = mixed_steps(engine, prompts, SamplingParams(max_tokens=MAX_TOKENS))
    assert outputs == truth
    spec = engine.stats.speculation
    assert spec.num_drafted > 0 and spec.num_accepted <= spec.num_drafted
    assert mixed >= 1 or method == "ngram"  # lookup rarely proposes beside a prefill here
    if method == "oracle":
        assert engine.drafter.num_drafted == spec.num_drafted
        assert spec.num_accepted == engine.drafter.expected_accepted > 0
    if engine.model_config.has_attention:  # 12 usable KV blocks cannot hold all four requests
        assert engine.inspect.scheduler.num_preemptions >= 1
    assert_pools_empty(engine)


@pytest.mark.parametrize("family", quick_first(FAMILIES))
def test_draft_model_equal_to_target_accepts_every_draft(family):
    """The draft model's state rolls back by slot choice exactly: with the target as its own draft
    model every greedy draft is accepted, through preemption and mixed steps."""
    prompts = distinct_prompts(5)
    engine = spec_engine(family, "draft_model", 3, draft=f"target:{family}")
    outputs = serve(engine, prompts, SamplingParams(max_tokens=MAX_TOKENS))
    assert outputs == {str(i): naive_greedy(family, p, MAX_TOKENS) for i, p in enumerate(prompts)}
    spec = engine.stats.speculation
    assert spec.num_drafted > 10 and spec.num_accepted == spec.num_drafted
    assert spec.mean_acceptance_length > 2.0
    assert_pools_empty(engine)


@pytest.mark.parametrize("method", ["ngram", "draft_model"])
def test_a_speculative_engine_refuses_penalties(method):
    """Each lane's penalties would have to count the drafts before it: refused, like logprobs,
    and the engine queues nothing."""
    engine = spec_engine("mamba2", method, 2, draft="target:mamba2")
    with pytest.raises(ValueError, match="frequency_penalty=0.5.*speculative decoding"):
        engine.add_request([1, 2, 3], SamplingParams(frequency_penalty=0.5))
    assert not engine.has_unfinished


def test_sampled_requests_get_the_same_tokens_with_and_without_drafts():
    """Lane t samples output len(outputs) + t from the request's own (seed, index) stream, and a
    draft is accepted iff it equals that sample: drafts change nothing but the step count."""
    family = "nemotron_h"
    prompts = distinct_prompts(7)
    params = [
        SamplingParams(max_tokens=MAX_TOKENS, temperature=t, top_p=p, top_k=k, seed=s)
        for t, p, k, s in ((0.8, 1.0, 0, 1), (1.3, 0.9, 0, 2), (0.6, 1.0, 20, 3), (0.0, 1.0, 0, 4))
    ]
    plain = spec_engine(family, "ngram", 2)
    plain.drafter.num_wanted = lambda request: 0  # the same engine, never a draft
    ids = [plain.add_request(p, q) for p, q in zip(prompts, params, strict=True)]
    without = run_to_completion(plain)
    truth = {i: without[i] for i in ids}
    engine = spec_engine(family, "ngram", 3)
    engine.drafter = Oracle(truth, 3, seed=1)
    for prompt, q in zip(prompts, params, strict=True):
        engine.add_request(prompt, q)
    assert run_to_completion(engine) == truth
    spec = engine.stats.speculation
    assert spec.num_accepted == engine.drafter.expected_accepted > 0
    assert_pools_empty(engine)


@pytest.mark.parametrize("family", ["nemotron_h"])
def test_stop_rules_cut_accepted_drafts(family):
    """A stop id inside the accepted drafts ends the request there; min_tokens masks the stop id
    on the lanes short of it (their output index); max_tokens and max_model_len cut exactly."""
    prompt = list(range(40, 50))
    free = naive_greedy(family, prompt, 12, stop_ids=())
    stop = free[5]
    cases = [
        SamplingParams(max_tokens=12, stop_token_ids=(stop,), ignore_eos=True),
        SamplingParams(max_tokens=12, stop_token_ids=(stop,), min_tokens=8, ignore_eos=True),
        SamplingParams(max_tokens=7, ignore_eos=True),
    ]
    for params in cases:
        truth = naive_greedy(
            family, prompt, params.max_tokens, params.stop_token_ids, params.min_tokens
        )
        engine = spec_engine(family, "ngram", 4)
        engine.drafter = Oracle({"0": truth}, 4, seed=2)
        engine.add_request(prompt, params)
        assert run_to_completion(engine)["0"] == truth, params
        assert_pools_empty(engine)
    long_prompt = list(range(3, 60))  # 57 tokens: max_model_len 64 leaves room for 7
    truth = naive_greedy(family, long_prompt, 20, stop_ids=())
    engine = spec_engine(family, "ngram", 4)
    engine.drafter = Oracle({"0": truth}, 4, seed=3)
    engine.add_request(long_prompt, SamplingParams(max_tokens=20, ignore_eos=True))
    assert run_to_completion(engine)["0"] == truth and len(truth) == 7


@slow
def test_ngram_on_the_trained_preset_accepts_drafts():
    """The trained stdlib model repeats code it has seen: prompt lookup drafts are accepted often,
    steps drop, and the tokens equal those of the same engine proposing nothing."""
    texts = [
        "    def __init__(self, name):\n        self.name = name\n\n    def __repr__(self):\n",
        "import os\nimport sys\nimport re\nimport json\nimport ",
        "x = self.x\ny = self.y\nz = self.",
    ]
    prompts = [list(text.encode()) for text in texts]
    engine = trained_engine()
    engine.drafter.num_wanted = lambda request: 0
    for prompt in prompts:
        engine.add_request(prompt, SamplingParams(max_tokens=40))
    without, steps_without = run_to_completion(engine), engine.stats.num_steps
    engine = trained_engine()
    for prompt in prompts:
        engine.add_request(prompt, SamplingParams(max_tokens=40))
    assert run_to_completion(engine) == without
    spec = engine.stats.speculation
    assert spec.acceptance_rate > 0.3 and engine.stats.num_steps < 0.8 * steps_without
