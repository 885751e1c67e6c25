"""A process per data-parallel rank (`runtime.ranks`): two and four rank processes give the
tokens of one engine in this process, greedy and sampled, generated and streamed; a rank process
that dies fails the group within a bounded time and stops the others.

The rank processes share this run's compilation cache with this process: every rank is the same
one-rank engine as the reference, so they load the programs it compiled."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator

import numpy as np
import pytest

from runtime.core.sampling_params import SamplingParams
from runtime.llm import LLM
from runtime.ranks.group import RankFailure, RankGroup
from runtime.ranks.launch import CPU_DEVICES_FLAG, rank_environment
from tests.runtime.ranks.cache import shared_cache_env
from tests.tiers import slow

MODEL = "tiny-nemotron_h"  # attention and Mamba2 layers: KV blocks and state slots per rank
OPTIONS = dict(
    max_num_seqs=2, max_num_batched_tokens=32, max_model_len=64, block_size=8, validate_inputs=True
)
PROMPTS = [
    np.random.default_rng(i).integers(0, 256, n).tolist()
    for i, n in enumerate((3, 30, 11, 1, 25, 7, 17))
]
GREEDY = SamplingParams(max_tokens=6)
SAMPLED = SamplingParams(max_tokens=6, temperature=0.9, top_p=0.95)  # seeds from arrival order
DEATH_SECONDS = 30  # how long a dead rank may take to fail the group


@pytest.fixture(scope="module", autouse=True)
def shared_compile_cache(tmp_path_factory):
    """This process's compilation cache for the rank processes too (they inherit os.environ)."""
    saved = dict(os.environ)
    os.environ.update(shared_cache_env(tmp_path_factory.mktemp("rank_cache")))
    yield
    os.environ.clear()
    os.environ.update(saved)


Served = list[tuple[list[int], str | None, str]]


def served(llm: LLM, params: SamplingParams) -> Served:
    outputs = llm.generate(PROMPTS, params, use_tqdm=False)
    return [(o.token_ids, o.text, o.finish_reason) for o in outputs]


@pytest.fixture(scope="module")
def one_engine() -> dict[str, Served]:
    """One engine's outputs (before any rank starts: its programs are then in the cache)."""
    llm = LLM(MODEL, **OPTIONS)
    outputs = {"greedy": served(llm, GREEDY), "sampled": served(llm, SAMPLED)}
    return outputs | {"stopped": served(llm, stop_at(outputs["greedy"]))}


def stop_at(greedy: Served) -> SamplingParams:
    """A stop string that one request's greedy text holds."""
    return SamplingParams(max_tokens=12, stop=[greedy[1][1][2:4]])


@pytest.fixture(scope="module")
def two_ranks(one_engine) -> Iterator[LLM]:
    """Two rank processes (started after the reference engine compiled: they load its
    programs); the last test of the module kills one."""
    two = LLM(MODEL, data_parallel_size=2, **OPTIONS)
    yield two
    two.engine.close()


def test_two_rank_processes_give_the_tokens_of_one_engine(one_engine, two_ranks):
    two = two_ranks
    assert isinstance(two.engine, RankGroup) and two.model is None
    assert served(two, GREEDY) == one_engine["greedy"]
    assert served(two, SAMPLED) == one_engine["sampled"]
    streamed: dict[str, str] = {}
    for delta in two.stream(PROMPTS, stop_at(one_engine["greedy"])):
        streamed[delta.request_id] = streamed.get(delta.request_id, "") + (delta.text or "")
    first = 2 * len(PROMPTS)  # the ids go on from the two generate calls'
    texts = [streamed[str(first + i)] for i in range(len(PROMPTS))]
    assert texts == [text for _, text, _ in one_engine["stopped"]]
    ranks = two.stats.ranks
    assert len(ranks) == 2 and all(rank.num_live_steps > 0 for rank in ranks)
    assert "NemotronH" in repr(two)


@slow
def test_four_rank_processes_give_the_tokens_of_one_engine(one_engine):
    four = LLM(MODEL, data_parallel_size=4, **OPTIONS)
    try:
        assert served(four, GREEDY) == one_engine["greedy"]
        assert sum(rank.num_live_steps > 0 for rank in four.stats.ranks) == 4
    finally:
        four.engine.close()


def test_a_bad_model_is_refused_before_any_rank_starts():
    with pytest.raises(ValueError, match="unknown preset 'tiny-nope'"):
        LLM("tiny-nope", data_parallel_size=2)


def test_each_rank_sees_its_own_devices():
    base = {"CUDA_VISIBLE_DEVICES": "3,5,7,9", "XLA_FLAGS": f"--a=1 {CPU_DEVICES_FLAG}=8"}
    env = rank_environment(1, 2, base)
    assert env["CUDA_VISIBLE_DEVICES"] == "7,9"
    assert env["XLA_FLAGS"] == f"--a=1 {CPU_DEVICES_FLAG}=2"
    assert rank_environment(2, 1, {})["CUDA_VISIBLE_DEVICES"] == "2"
    with pytest.raises(ValueError, match="rank 2 needs devices 4..5"):
        rank_environment(2, 2, base)


def test_a_dead_rank_fails_the_group_in_bounded_time(two_ranks):  # keep last: it kills a rank
    group = two_ranks.engine
    assert isinstance(group, RankGroup)
    long = SamplingParams(max_tokens=40, ignore_eos=True)
    for prompt in PROMPTS[:4]:
        group.add_request(prompt, long)
    group.step()
    victim = group._processes[1].process
    os.kill(victim.pid, signal.SIGKILL)
    start = time.perf_counter()
    with pytest.raises(RankFailure, match=r"rank 1's process failed.*signal 9"):
        while group.has_unfinished:
            group.step()
    assert time.perf_counter() - start < DEATH_SECONDS
    assert group._processes[0].process.poll() is not None  # the other rank was stopped
    with pytest.raises(RankFailure):  # and the group serves no more
        group.add_request([1, 2, 3], GREEDY)
