"""Cache events of a prefix-caching run: a router's view of each step equals the cache.

A tiny hybrid (NemotronH: attention and Mamba2 layers) with small pools, so KV blocks and
states are evicted, serves prompts that share prefixes. A consumer on a real ZMQ SUB socket
decodes every batch with vLLM's schema (kv_events_consumer.py) and, after each step, its index
of group 0 (KV blocks) and group 1 (states) equals the cache's published entries; from that
index alone it predicts every prompt's hit exactly as the rank's own lookup finds it. One engine
and one runner (3 step variants).
"""

from __future__ import annotations

import socket

import jax
import numpy as np
import pytest
from flax import nnx

import jmamba
from runtime.core.engine_args import EngineArgs
from runtime.core.request import Request
from runtime.core.sampling_params import SamplingParams
from runtime.engine import Engine
from runtime.prefix_cache.events import RecordedEvents
from runtime.prefix_cache.slots import CachingSlots
from tests.runtime.prefix_cache.kv_events_consumer import (
    AllBlocksCleared,
    BlockRemoved,
    HeldBlocks,
    Subscriber,
)

BLOCK, STATE_BLOCK, BUDGET = 8, 16, 48


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def prompts() -> list[list[int]]:
    """Four families of prompts that share 32- or 48-token prefixes, 40-70 tokens long."""
    rng = np.random.default_rng(0)
    stems = [rng.integers(1, 250, 48).tolist() for _ in range(4)]
    return [
        stem[: 32 + 16 * (i % 2)] + rng.integers(1, 250, 8 + 4 * i).tolist()
        for stem in stems
        for i in range(3)
    ]


@pytest.fixture(scope="module")
def engine_and_subscriber():
    port, replay = free_port(), free_port()
    events = {
        "enable_kv_cache_events": True,
        "endpoint": f"tcp://*:{port}",
        "replay_endpoint": f"tcp://*:{replay}",
        "topic": "kv-events",
    }
    args = EngineArgs(
        max_num_seqs=2,
        max_num_batched_tokens=BUDGET,
        max_model_len=96,
        block_size=BLOCK,
        num_blocks=26,  # 25 usable: two running requests and a few cached prefixes
        max_cached_states=5,
        state_block_size=STATE_BLOCK,
        prefix_caching="all",
        decode_row_buckets=(2,),
        prefill_token_buckets=(BUDGET,),
        prefill_row_buckets=(2,),
        kv_events_config=events,
    )
    model = jmamba.HybridLM(jmamba.presets.tiny("nemotron_h"), rngs=nnx.Rngs(0))
    engine = Engine(model, args)
    subscriber = Subscriber(f"tcp://127.0.0.1:{port}", f"tcp://127.0.0.1:{replay}", "kv-events")
    yield engine, subscriber
    slots = engine.schedulers[0].slots
    assert isinstance(slots, CachingSlots)
    slots.events.close()
    subscriber.close()
    jax.clear_caches()


def catch_up(subscriber: Subscriber, events: RecordedEvents, view: HeldBlocks) -> list:
    """Apply every batch published so far to `view`; returns their events."""
    seen = []
    while subscriber.next_sequence < events.num_published:
        batches = subscriber.receive_or_replay()
        assert batches, f"batch {subscriber.next_sequence} never came"
        for _, batch in batches:
            assert batch.data_parallel_rank == 0
            view.apply(batch)
            seen += batch.events
    return seen


def test_router_view_equals_cache_every_step(engine_and_subscriber):
    engine, subscriber = engine_and_subscriber
    slots = engine.schedulers[0].slots
    assert isinstance(slots, CachingSlots) and isinstance(slots.events, RecordedEvents)
    cache, view, seen = slots.cache, HeldBlocks(), []
    greedy = SamplingParams(max_tokens=6, temperature=0.0)
    for prompt in prompts():
        engine.add_request(prompt, greedy)
    steps = 0
    while engine.has_unfinished:
        engine.step()
        steps += 1
        seen += catch_up(subscriber, slots.events, view)
        assert view.groups.get(0, set()) == set(cache.block_digests), f"step {steps}"
        assert view.groups.get(1, set()) == set(cache.published_states), f"step {steps}"
    assert view.kinds == {0: "full_attention", 1: "mamba"}
    removed = {e.group_idx for e in seen if isinstance(e, BlockRemoved)}
    assert removed == {0, 1}, "small pools: KV blocks and states are both evicted"
    assert cache.stats.hits > 0
    # Exact routing: the router's hit for each prompt is the rank's own lookup.
    for i, prompt in enumerate([*prompts(), prompts()[0][:40] + [7] * 20]):
        request = Request(f"probe{i}", prompt, greedy, seed=0)
        request.num_prefill_tokens = len(prompt)
        expected = cache.lookup(request).num_tokens
        assert view.hit_tokens(prompt, BLOCK, STATE_BLOCK) == expected, prompt
    cache.reset()  # nothing runs: the cache empties, one AllBlocksCleared
    slots.end_step()
    cleared = catch_up(subscriber, slots.events, view)
    assert [type(e) for e in cleared] == [AllBlocksCleared]
    assert not any(view.groups.values())
