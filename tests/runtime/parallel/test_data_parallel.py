"""Data parallelism on the fake CPU devices: same tokens as one device, idle ranks touch nothing.

The seed bug (vLLM #37728): a data-parallel rank with no work ran a dummy step whose stale
block-table row pointed at a live request's recurrent state and corrupted it. Here an idle rank's
step is an all-padding `StepInputs`, so after every step in which a rank was idle, every non-NULL
block and slot of its shard must be bit-identical to before, read back from the device.
"""

from __future__ import annotations

import dataclasses

import jax
import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from runtime.core.engine_args import EngineArgs
from runtime.core.sampling_params import SamplingParams
from runtime.device.memory import resolve_config
from runtime.device.model_runner import ModelRunner
from runtime.engine import Engine
from tests.compiled import per_module
from tests.runtime.conftest import (
    DECODE_STEPS,
    base_config,
    make_engine,
    model_and_runner,
    run_to_completion,
)
from tests.tiers import slow


@per_module
def dp_runner(family: str, ranks: int) -> ModelRunner:
    """One compiled runner per (family, ranks), its pools poisoned: NaN in every rank's NULL
    block and slot 0 (they must never reach an output)."""
    model, _ = model_and_runner(family)
    config = dataclasses.replace(base_config(family), data_parallel_size=ranks)
    runner = ModelRunner(model, resolve_config(model, config), keep_logits=True)
    set_null_entries(runner, np.nan)
    return runner


def dp_engine(
    family: str, ranks: int, router=None, async_scheduling: bool = False, decode_steps: int = 1
) -> Engine:
    model, _ = model_and_runner(family)
    runner = dp_runner(family, ranks)
    config = dataclasses.replace(
        EngineArgs.of_config(runner.config),
        async_scheduling=async_scheduling,
        decode_steps=decode_steps,
    )
    return Engine(model, config, runner=runner, router=router)


def set_null_entries(runner: ModelRunner, value: float) -> None:
    """Write `value` into entry 0 of every rank's shard of every pool (shardings kept)."""
    ranks = runner.mesh.size

    def poison(leaf):
        return leaf.at[np.arange(ranks) * (leaf.shape[0] // ranks)].set(value)

    runner.caches = jax.jit(
        lambda c: jax.tree.map(poison, c), out_shardings=runner.cache_shardings
    )(runner.caches)


def rank_shards(runner: ModelRunner, rank: int) -> list[np.ndarray]:
    """Every pool's entries 1.. of `rank`'s shard (its non-NULL blocks and slots), on the host."""
    ranks = runner.mesh.size
    shards = []
    for leaf in jax.tree.leaves(runner.caches):
        n = leaf.shape[0] // ranks
        shards.append(np.asarray(leaf[rank * n + 1 : (rank + 1) * n]))
    return shards


def assert_bit_identical(before: list[np.ndarray], after: list[np.ndarray], what: str) -> None:
    for old, new in zip(before, after, strict=True):
        assert old.tobytes() == new.tobytes(), what


class PinnedRouter:
    """Places request `i` on rank `ranks[i]` (the test decides where arrivals concentrate)."""

    def __init__(self, ranks: dict[str, int]) -> None:
        self.ranks = ranks

    def place(self, request, schedulers) -> int:
        return self.ranks[request.request_id]


PROMPT_LENS = (1, 13, 37, 20, 5, 29)


def test_four_ranks_give_the_single_device_tokens(family):
    """DP = 4: every request's greedy tokens equal the single-device engine's."""
    rng = np.random.default_rng(3)
    prompts = [rng.integers(0, 256, n).tolist() for n in PROMPT_LENS]
    single, multi = make_engine(family), dp_engine(family, 4)
    expected = {single.add_request(p, SamplingParams(max_tokens=5)): p for p in prompts}
    got = {multi.add_request(p, SamplingParams(max_tokens=5)): p for p in prompts}
    assert set(multi.rank_of(i) for i in got) == {0, 1, 2, 3}  # least work spreads them
    single_out, multi_out = run_to_completion(single), run_to_completion(multi)
    assert [multi_out[i] for i in got] == [single_out[i] for i in expected]
    assert all(s.block_pool.num_used == 0 and s.slot_pool.num_used == 0 for s in multi.schedulers)


def step_checking_idle_ranks(engine: Engine) -> tuple[list, list[int], int]:
    """One engine step (a program of one or several steps); asserts that every rank that was
    idle in each of its steps kept its shard bit-identical. Returns (finished outputs, idle
    ranks, steps the program ran)."""
    before = [rank_shards(engine.runner, r) for r in engine.ranks]
    num_steps = engine.stats.num_steps
    finished = engine.step()
    if engine.stats.num_steps == num_steps:
        return finished, [], 0  # nothing was scheduled anywhere: no step ran
    program = engine.last_program
    assert program is not None
    idle = [
        rank
        for i, rank in enumerate(engine.ranks)
        if all(step.schedules[i].is_empty for step in program.steps)
    ]
    for rank in idle:
        after = rank_shards(engine.runner, rank)
        assert_bit_identical(before[rank], after, f"idle rank {rank} changed its shard")
    result = engine.last_result  # None until a step retires (asynchronous: one step late)
    logits = None if result is None else result.logits
    assert logits is None or np.isfinite(logits).all()  # NaN in the NULL entries never leaks
    return finished, idle, len(program.steps)


def test_a_rank_that_finished_its_requests_runs_dummy_steps_and_touches_nothing():
    """vLLM #37728's scenario: rank 0's only request finishes after its first token while rank 1
    prefills a long prompt in chunks and decodes; rank 0's dummy steps leave its shard (the slot
    and blocks the finished request used included) bit-identical, and rank 1's tokens are right."""
    family = "nemotron_h"
    router = PinnedRouter({"short": 0, "long": 1})
    engine = dp_engine(family, 2, router)
    short, long = [7, 8, 9], np.random.default_rng(4).integers(0, 256, 50).tolist()
    engine.add_request(short, SamplingParams(max_tokens=1), request_id="short")
    engine.add_request(long, SamplingParams(max_tokens=6), request_id="long")
    outputs, idle_steps = {}, 0
    while engine.has_unfinished:
        finished, idle, _ = step_checking_idle_ranks(engine)
        outputs |= {o.request_id: o.token_ids for o in finished}
        idle_steps += idle == [0]
    assert idle_steps >= 5 and engine.stats.ranks[0].num_idle_steps == idle_steps
    alone = make_engine(family)
    ids = [alone.add_request(p, SamplingParams(max_tokens=n)) for p, n in ((short, 1), (long, 6))]
    expected = run_to_completion(alone)
    assert outputs == {"short": expected[ids[0]], "long": expected[ids[1]]}


request_strategy = st.fixed_dictionaries(
    {
        "arrival": st.integers(0, 8),
        "prompt_len": st.integers(1, 40),
        "max_tokens": st.integers(1, 6),
        "abort_at": st.none() | st.integers(0, 12),
        "seed": st.integers(0, 2**16),
    }
)


@per_module
def alone_tokens(family: str, prompt: tuple[int, ...], max_tokens: int) -> list[int]:
    engine = make_engine(family)
    request_id = engine.add_request(list(prompt), SamplingParams(max_tokens=max_tokens))
    return run_to_completion(engine)[request_id]


@given(
    ranks=st.sampled_from([2, 3, 4]),
    requests=st.lists(request_strategy, min_size=1, max_size=7),
    busy_ranks=st.integers(1, 2),
    placement_seed=st.integers(0, 2**16),
    async_scheduling=st.booleans(),
    decode_steps=st.sampled_from(DECODE_STEPS),
)
@slow
def test_random_schedules_over_ranks_keep_idle_shards_and_tokens(
    ranks, requests, busy_ranks, placement_seed, async_scheduling, decode_steps
):
    """Arrivals on only `busy_ranks` ranks (the others idle for many steps), aborts and preemption
    (small pools), with and without asynchronous scheduling: validate() on every rank every step,
    idle shards bit-identical, NaN in every NULL entry never reaches a logit, every completed
    request's tokens equal its run alone."""
    family = "nemotron_h"
    rng = np.random.default_rng(placement_seed)
    busy = min(busy_ranks, ranks - 1)  # the last rank never gets a request: idle every step
    pins = {str(i): int(rng.integers(0, busy)) for i in range(len(requests))}
    engine = dp_engine(family, ranks, PinnedRouter(pins), async_scheduling, decode_steps)
    prompts = [
        tuple(np.random.default_rng(r["seed"]).integers(0, 256, r["prompt_len"]).tolist())
        for r in requests
    ]
    outputs, aborted, step, idle_steps = {}, set(), 0, 0
    while step <= 8 or engine.has_unfinished:
        for i, r in enumerate(requests):
            if r["arrival"] == step:
                engine.add_request(
                    list(prompts[i]), SamplingParams(max_tokens=r["max_tokens"]), request_id=str(i)
                )
            if r["abort_at"] == step and engine.abort(str(i)) is not None:
                aborted.add(str(i))
        finished, idle, steps = step_checking_idle_ranks(engine)
        outputs |= {o.request_id: o.token_ids for o in finished}
        idle_steps += len(idle) * steps
        step += 1
        assert step < 400
    assert idle_steps >= engine.stats.num_steps
    for scheduler in engine.schedulers:
        assert scheduler.block_pool.num_used == 0 and scheduler.slot_pool.num_used == 0
    for i, r in enumerate(requests):
        if str(i) not in aborted:
            assert outputs[str(i)] == alone_tokens(family, prompts[i], r["max_tokens"]), i
