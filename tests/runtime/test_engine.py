"""The engine's greedy tokens equal a naive full-recompute greedy loop, for every tiny family."""

from __future__ import annotations

import numpy as np

from runtime.core.sampling_inputs import SamplingMode
from runtime.core.sampling_params import SamplingParams
from tests.runtime.conftest import make_engine, naive_greedy, run_to_completion

PROMPT_LENS = (1, 13, 37, 20)


def test_engine_greedy_equals_naive_recompute(family):
    """Chunked prefill + decode in a shared batch (with preemption) == recompute from scratch."""
    rng = np.random.default_rng(1)
    engine = make_engine(family)
    prompts = [rng.integers(0, 256, n).tolist() for n in PROMPT_LENS]
    ids = [engine.add_request(p, SamplingParams(max_tokens=6)) for p in prompts]
    outputs = run_to_completion(engine)
    for request_id, prompt in zip(ids, prompts, strict=True):
        assert outputs[request_id] == naive_greedy(family, prompt, 6), (family, len(prompt))
    if engine.model_config.has_attention:  # 12 usable KV blocks cannot hold all four requests
        assert engine.inspect.scheduler.num_preemptions >= 1
    variants = engine.runner.variants
    greedy = [v.bucket for v in variants if v.mode == SamplingMode() and not v.carry]
    assert len(greedy) <= 3  # decode-only, prefill-only, mixed (other tests add other modes)
    assert (
        engine.inspect.scheduler.block_pool.num_used == 0
        and engine.inspect.scheduler.slot_pool.num_used == 0
    )
