"""Random schedules on a dp = 2 x tp = 2 mesh with an idle rank and prefix caching on.

Every request goes to rank 0; rank 1 runs the idle-rank dummy step every step, on both of its
shards. After each step, every non-NULL block and slot of rank 1 (both shards' heads) is
bit-identical, NaN in every NULL entry never reaches a logit, `validate()` checks every step's
inputs, and every request that was not aborted gets the tokens of full recompute on one device.
"""

from __future__ import annotations

import dataclasses

from hypothesis import given, settings
from hypothesis import strategies as st

from runtime.core.engine_args import EngineArgs
from runtime.core.sampling_params import SamplingParams
from runtime.device.memory import resolve_config
from runtime.device.model_runner import ModelRunner
from runtime.engine import Engine
from tests.compiled import per_module
from tests.runtime.conftest import DECODE_STEPS, model_and_runner, naive_greedy
from tests.runtime.parallel.test_data_parallel import (
    PinnedRouter,
    set_null_entries,
    step_checking_idle_ranks,
)
from tests.runtime.prefix_cache.test_prefix_caching import (
    MAX_LEN,
    prefix_config,
    shared_prefix_arrivals,
    tokens,
)
from tests.tiers import slow

FAMILY = "nemotron_h"  # Mamba2 (2 groups over 2 shards), attention (2 KV heads), MoE, MLP


@per_module
def mesh_runner() -> ModelRunner:
    model, _ = model_and_runner(FAMILY)
    config = dataclasses.replace(
        prefix_config(FAMILY), data_parallel_size=2, tensor_parallel_size=2
    )
    runner = ModelRunner(model, resolve_config(model, config), keep_logits=True)
    set_null_entries(runner, float("nan"))
    return runner


@per_module
def reference(prompt: tuple[int, ...], max_tokens: int) -> list[int]:
    return naive_greedy(FAMILY, list(prompt), max_tokens, max_len=MAX_LEN)


request_strategy = st.fixed_dictionaries(
    {
        "arrival": st.integers(0, 6),
        "prefix": st.integers(0, 1),
        "shared": st.integers(0, 60),
        "own": st.integers(1, 20),
        "max_tokens": st.integers(1, 5),
        "abort_at": st.none() | st.integers(0, 10),
    }
)


@slow
@settings(max_examples=max(settings.default.max_examples // 15, 3))
@given(
    requests=st.lists(request_strategy, min_size=1, max_size=5),
    async_scheduling=st.booleans(),
    decode_steps=st.sampled_from(DECODE_STEPS),
)
def test_random_schedules_on_dp2_tp2_keep_the_idle_rank_and_tokens(
    requests, async_scheduling, decode_steps
):
    prefixes = [tokens(50 + k, 60) for k in range(2)]
    arrivals = shared_prefix_arrivals(requests, prefixes, seed=70)
    model, _ = model_and_runner(FAMILY)
    runner = mesh_runner()
    config = dataclasses.replace(
        EngineArgs.of_config(runner.config),
        async_scheduling=async_scheduling,
        decode_steps=decode_steps,
    )
    router = PinnedRouter({str(i): 0 for i in range(len(arrivals))})
    engine = Engine(model, config, runner=runner, router=router)
    outputs, aborted, step, idle_steps = {}, set(), 0, 0
    last = max([a for a, _, _ in arrivals] + [r["abort_at"] or 0 for r in requests])
    while step <= last or engine.has_unfinished:
        for i, (arrival, prompt, max_tokens) in enumerate(arrivals):
            if arrival == step:
                params = SamplingParams(max_tokens=max_tokens)
                engine.add_request(prompt, params, request_id=str(i))
            if requests[i]["abort_at"] == step and engine.abort(str(i)) is not None:
                aborted.add(str(i))
        finished, idle, steps = step_checking_idle_ranks(engine)
        outputs |= {o.request_id: o.token_ids for o in finished}
        idle_steps += steps if 1 in idle else 0
        step += 1
        assert step < 400
    assert idle_steps == engine.stats.num_steps  # rank 1 idled in every step that ran
    for i, (_, prompt, max_tokens) in enumerate(arrivals):
        if str(i) not in aborted:
            assert outputs[str(i)] == reference(tuple(prompt), max_tokens), i
