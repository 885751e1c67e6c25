"""Prefix-cache hit rates of the scheduler on shared-prefix and chat workloads (no model: hits
depend on scheduling and token ids only), at concurrency 1 and 32, in "align" and "all" mode,
each asserted above a bound derived from the workload.

Units: chunk c = 16, KV block 8, state block a = 16 tokens; N = 64 requests, 4 output tokens
each (every sampled token is 5). Token hit rate = prompt tokens skipped / prompt tokens admitted.

Measured (this file's workloads; `python -m tests.runtime.prefix_cache.test_prefix_hit_rates`
prints them):

    workload            concurrency  budget   align   all
    prefix 96 + own 8       1          64     0.914  0.914
    prefix 96 + own 8      32          64     0.873  0.873
    prefix 100 + own 40     1          64     0.452  0.678
    prefix 100 + own 40    32          64     0.423  0.640
    prefix 100 + own 40     1         256     0.000  0.678
    chat, 8 turns           1          64     0.448  0.844

"align" caches only chunk ends, so it finds a shared prefix only where a chunk happens to end on
the prefix's last state block boundary: with the budget of a real engine (a whole prompt in one
chunk) it finds none when a request's own tokens reach past a boundary (the 0.000 row: vLLM
#42317), and it never caches a decoded answer. "all" caches every boundary, so the longest
shared multiple of the state block is always found. Hence the default mode is "all".
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from runtime.core.engine_args import EngineArgs
from runtime.core.request import Request
from runtime.core.sampling_params import SamplingParams
from runtime.core.scheduler import Scheduler
from runtime.prefix_cache.cache import PrefixCacheStats
from tests.runtime.core.test_scheduler import new_scheduler

CHUNK, BLOCK, STATE_BLOCK, N, MAX_TOKENS = 16, 8, 16, 64, 4
CACHED_STATES = 32  # room for every state a workload here writes but a few


def scheduler_for(mode: str, concurrency: int, budget: int) -> Scheduler:
    config = EngineArgs(
        max_num_seqs=concurrency,
        max_num_batched_tokens=budget,
        max_model_len=512,
        block_size=BLOCK,
        state_block_size=STATE_BLOCK,
        prefix_caching=mode,
        max_cached_states=CACHED_STATES,
    )
    return new_scheduler(config, CHUNK)


def shared_prefix_prompts(prefix_len: int, own_len: int) -> list[list[int]]:
    rng = np.random.default_rng(0)
    prefix = rng.integers(0, 1000, prefix_len).tolist()
    return [prefix + rng.integers(1000, 2000, own_len).tolist() for _ in range(N)]


def serve(scheduler: Scheduler, prompts: list[list[int]]) -> PrefixCacheStats:
    """All requests queued at once, served to completion."""
    for i, prompt in enumerate(prompts):
        scheduler.add(Request(str(i), prompt, SamplingParams(max_tokens=MAX_TOKENS), seed=0))
    for _ in range(10_000):
        if not scheduler.has_unfinished:
            return scheduler.slots.cache.stats
        schedule = scheduler.schedule()
        scheduler.postprocess(schedule, [5] * len(schedule.items))
    raise AssertionError("did not finish")


def chat(mode: str, turns: int = 8) -> PrefixCacheStats:
    """One conversation at concurrency 1: each turn's prompt is the previous prompt, its answer
    (MAX_TOKENS tokens) and a new 20-token question."""
    scheduler = scheduler_for(mode, 1, 64)
    rng = np.random.default_rng(1)
    prompt = rng.integers(0, 1000, 30).tolist()
    for turn in range(turns):
        request = Request(str(turn), prompt, SamplingParams(max_tokens=MAX_TOKENS), seed=0)
        scheduler.add(request)
        while scheduler.has_unfinished:
            schedule = scheduler.schedule()
            scheduler.postprocess(schedule, [5] * len(schedule.items))
        prompt = prompt + request.output_token_ids + rng.integers(0, 1000, 20).tolist()
    return scheduler.slots.cache.stats


def misses_before_prefix_is_published(prefix_len: int, concurrency: int, budget: int) -> int:
    """How many requests may be admitted before the state at the shared prefix's end is published.

    The oldest prefill advances by at least k*a tokens a step, k = (B - S + 1) // a (scheduler
    docstring), so the first request crosses the prefix by step s = ceil(P / (k*a)) - 1 and the
    state is published after that step. Until then every admitted request had at least a tokens
    left (its hit, if any, ends before the prefix, which is at least a short of its prompt end),
    so each took at least a tokens of the budget: at most B // a admissions per step.
    At concurrency 1 the first request finishes before the next is admitted: one miss.
    """
    if concurrency == 1:
        return 1
    k = (budget - concurrency + 1) // STATE_BLOCK
    steps = math.ceil(prefix_len / (k * STATE_BLOCK))
    return steps * (budget // STATE_BLOCK)


@pytest.mark.parametrize("mode", ["align", "all"])
@pytest.mark.parametrize("concurrency", [1, 32])
def test_a_state_aligned_shared_prefix_is_found_in_both_modes(mode, concurrency):
    """96 shared tokens (6 state blocks) + 8 own: every chunk end of the first request's prompt
    includes the boundary at 96 (the last one before its end), so both modes cache the state at
    96. At concurrency 1 every later request hits 96: rate >= (N - 1) * 96 / (N * 104). At 32,
    at most m requests are admitted before that state is published
    (`misses_before_prefix_is_published`): rate >= (N - m) * 96 / (N * 104)."""
    prefix, own, budget = 96, 8, 64
    stats = serve(scheduler_for(mode, concurrency, budget), shared_prefix_prompts(prefix, own))
    misses = misses_before_prefix_is_published(prefix, concurrency, budget)
    bound = (N - misses) * prefix / (N * (prefix + own))
    assert stats.lookups == N and stats.token_hit_rate >= bound, (stats, bound)


@pytest.mark.parametrize("concurrency", [1, 32])
def test_a_shared_prefix_ending_mid_block_is_found_at_its_last_boundary_in_all_mode(concurrency):
    """100 shared tokens + 40 own: "all" caches every boundary, so later requests hit 96, the
    longest shared multiple of 16; bounds as above with 96 for the hit and 140 per prompt.
    "align" caches only chunk ends: at concurrency 1 the first request's chunks end at 64, 128
    and 140 (a 64-token budget), so every later request hits exactly 64; at concurrency 32 the
    budget is shared and some chunks happen to end at 96. "all" never does worse."""
    prefix, own, budget = 100, 40, 64
    prompts = shared_prefix_prompts(prefix, own)
    all_mode = serve(scheduler_for("all", concurrency, budget), prompts)
    align = serve(scheduler_for("align", concurrency, budget), prompts)
    misses = misses_before_prefix_is_published(prefix, concurrency, budget)
    assert all_mode.token_hit_rate >= (N - misses) * 96 / (N * 140), all_mode
    if concurrency == 1:
        assert align.hit_tokens == (N - 1) * 64
    assert all_mode.token_hit_rate >= align.token_hit_rate


def test_align_finds_nothing_when_a_whole_prompt_is_one_chunk():
    """Budget 256 >= every prompt (140): "align" cuts each prompt only at its last boundary (128,
    past the shared 100 tokens), so nothing shared is ever cached (vLLM #42317's 0%); "all" still
    hits 96 for every request after the first."""
    prompts = shared_prefix_prompts(100, 40)
    assert serve(scheduler_for("align", 1, 256), prompts).hit_tokens == 0
    assert serve(scheduler_for("all", 1, 256), prompts).hit_tokens == (N - 1) * 96


def test_a_chat_hits_its_previous_answer_in_all_mode():
    """Turn t's prompt holds turn t-1's prompt and answer. "all" hits the last boundary at or
    before the previous answer's last fed token (a decode step that crossed it cached it), so
    each later turn recomputes less than a state block of the old context plus its new question:
    hit >= len(previous prompt) + MAX_TOKENS - 1 - 15 per turn. "align" hits at most the last
    chunk end of the previous prompt (it never caches decoded tokens), and "all" beats it."""
    all_mode, align = chat("all"), chat("align")
    lengths = [30 + 24 * t for t in range(8)]  # each turn adds 4 answer + 20 question tokens
    floor = sum(max(length + MAX_TOKENS - 1 - (STATE_BLOCK - 1), 0) for length in lengths[:-1])
    assert all_mode.hits == 7 and all_mode.hit_tokens >= floor, all_mode
    assert align.hit_tokens <= sum(length // STATE_BLOCK * STATE_BLOCK for length in lengths[:-1])
    assert all_mode.token_hit_rate > align.token_hit_rate


if __name__ == "__main__":
    rows = [("prefix 96 + own 8", 96, 8, c, 64) for c in (1, 32)]
    rows += [("prefix 100 + own 40", 100, 40, c, 64) for c in (1, 32)]
    rows += [("prefix 100 + own 40", 100, 40, 1, 256)]
    for name, prefix, own, concurrency, budget in rows:
        rates = [
            serve(
                scheduler_for(m, concurrency, budget), shared_prefix_prompts(prefix, own)
            ).token_hit_rate
            for m in ("align", "all")
        ]
        print(f"{name:20s} {concurrency:4d} {budget:6d}  " + "  ".join(f"{r:.3f}" for r in rates))
    print(
        f"{'chat, 8 turns':20s} {1:4d} {64:6d}  "
        + "  ".join(f"{chat(m).token_hit_rate:.3f}" for m in ("align", "all"))
    )
