"""The engine's greedy tokens equal a naive full-recompute greedy loop, for every tiny family."""

from __future__ import annotations

import numpy as np
import pytest

from runtime.core.sampling_inputs import SamplingMode
from runtime.core.sampling_params import SamplingParams
from tests.runtime.conftest import (
    GREEDY_TIE,
    assert_greedy,
    make_engine,
    naive_greedy,
    naive_logits,
    naive_logits_each,
    run_to_completion,
)

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
    greedy = [v.bucket for v in variants if v.mode == SamplingMode()]
    assert len(greedy) <= 3  # decode-only, prefill-only, mixed (other tests add other modes)
    assert (
        engine.inspect.scheduler.block_pool.num_used == 0
        and engine.inspect.scheduler.slot_pool.num_used == 0
    )


def test_the_teacher_forced_greedy_check_agrees_with_the_loop_and_refuses_what_it_should():
    """`assert_greedy` checks tokens against one full recompute of prompt + tokens: its rows are
    the loop's logits after each prefix (within rounding), it passes the loop's own tokens, and
    refuses a short answer and a token that is not greedy (nor a tie)."""
    family, prompt = "mamba2", list(range(40, 51))
    want = naive_greedy(family, prompt, 6)
    assert len(want) == 6  # no EOS among them: the check below needs all six
    each = naive_logits_each(family, prompt + want)
    for i in range(len(want)):
        loop = naive_logits(family, prompt + want[:i])
        np.testing.assert_allclose(each[len(prompt) + i - 1], loop, rtol=0, atol=1e-5)
    assert_greedy(family, prompt, want, 6)
    with pytest.raises(AssertionError, match="5 tokens where greedy makes 6"):
        assert_greedy(family, prompt, want[:5], 6)
    row = each[len(prompt) + 2]
    runner_up = int(np.argsort(row)[-2])
    assert row[want[3]] - row[runner_up] > GREEDY_TIE  # a clear choice, not a tie
    with pytest.raises(AssertionError, match="token 3"):
        assert_greedy(family, prompt, [*want[:3], runner_up, *want[4:]], 6)
