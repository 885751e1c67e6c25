"""Speculative decoding over a data-parallel mesh of two fake CPU devices: the ranks agree on the
bucket (1 + K lanes) and the sampler mode, an idle rank runs all-padding steps, the draft model
runs its passes on the same mesh; tokens equal full recompute and counters are kept per rank."""

from __future__ import annotations

import numpy as np

from runtime.core.sampling_params import SamplingParams
from tests.runtime.conftest import naive_greedy, run_to_completion
from tests.runtime.parallel.test_data_parallel import PinnedRouter
from tests.runtime.speculative.spec_support import Oracle, spec_engine

FAMILY = "mamba2"
PROMPT_LENS = (3, 30, 9, 17, 5)
RANKS = {"0": 0, "1": 0, "2": 1, "3": 0, "4": 1}  # rank 1 is idle at first and last


def serve(engine, prompts, late=(3, 4)) -> dict[str, list[int]]:
    params = SamplingParams(max_tokens=8)
    for i, prompt in enumerate(prompts):
        if i not in late:
            engine.add_request(prompt, params, request_id=i)
    outputs = {}
    for _ in range(3):
        outputs |= {o.request_id: o.token_ids for o in engine.step()}
    for i in late:
        engine.add_request(prompts[i], params, request_id=i)
    return outputs | run_to_completion(engine)


def prompts_and_truth() -> tuple[list[list[int]], dict[str, list[int]]]:
    rng = np.random.default_rng(4)
    prompts = [rng.integers(0, 256, n).tolist() for n in PROMPT_LENS]
    truth = {str(i): naive_greedy(FAMILY, p, 8) for i, p in enumerate(prompts)}
    return prompts, truth


def test_drafts_on_two_ranks_equal_full_recompute():
    prompts, truth = prompts_and_truth()
    engine = spec_engine(FAMILY, "ngram", 3, ranks=2)
    engine.router = PinnedRouter(RANKS)
    engine.drafter = Oracle(truth, 3, seed=5)
    assert serve(engine, prompts) == truth
    ranks = [rank.speculation for rank in engine.stats.ranks]
    assert all(r.num_drafted > 0 for r in ranks)
    assert sum(r.num_accepted for r in ranks) == engine.drafter.expected_accepted > 0
    assert any(rank.num_idle_steps for rank in engine.stats.ranks)
    for scheduler in engine.schedulers:
        assert scheduler.slot_pool.num_used == 0 and scheduler.block_pool.num_used == 0


def test_draft_model_on_two_ranks_accepts_every_draft_of_the_target():
    prompts, truth = prompts_and_truth()
    engine = spec_engine(FAMILY, "draft_model", 3, draft=f"target:{FAMILY}", ranks=2)
    engine.router = PinnedRouter(RANKS)
    assert serve(engine, prompts) == truth
    spec = engine.stats.speculation
    assert spec.num_drafted > 10 and spec.num_accepted == spec.num_drafted
    assert all(rank.speculation.num_drafted > 0 for rank in engine.stats.ranks)
    for rank in engine.drafter.ranks:
        assert rank.slot_pool.num_used == 0
