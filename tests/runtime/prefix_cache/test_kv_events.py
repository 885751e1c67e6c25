"""Cache events without a model: the encoding against vLLM's schema, the publisher's frames,
replay and per-rank endpoints, the config and its CLI option.

The consumer side (tests/runtime/prefix_cache/kv_events_consumer.py) decodes with vLLM's schema
written out independently; the raw msgpack is also read with the msgpack package alone.
"""

from __future__ import annotations

import argparse
import dataclasses
import socket

import msgpack
import pytest

from runtime.cli.engine_options import add_engine_options, engine_options
from runtime.core.engine_args import EngineArgs
from runtime.core.kv_events_config import KVEventsConfig, rank_endpoint
from runtime.core.pools import Pool
from runtime.core.request import Request
from runtime.core.sampling_params import SamplingParams
from runtime.prefix_cache.cache import PrefixCache
from runtime.prefix_cache.events import KV_GROUP, STATE_GROUP, EventBatch, RecordedEvents
from runtime.prefix_cache.slots import cache_events
from tests.runtime.prefix_cache.kv_events_consumer import (
    DECODER,
    BlockRemoved,
    BlockStored,
    HeldBlocks,
    Subscriber,
)

BLOCK = 4
# The keys a map-encoded vLLM event has (omit_defaults drops extra_keys and the sliding window).
STORED_KEYS = {
    "type",
    "block_hashes",
    "parent_block_hash",
    "token_ids",
    "block_size",
    "lora_id",
    "medium",
    "lora_name",
    "group_idx",
    "kv_cache_spec_kind",
}


class Captured:
    """A publisher that keeps what it is given."""

    def __init__(self) -> None:
        self.batches: list[EventBatch] = []

    def publish(self, batch: EventBatch) -> None:
        self.batches.append(batch)

    def close(self) -> None:
        pass


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def a_cache(events: RecordedEvents, num_blocks: int = 6, max_states: int = 2) -> PrefixCache:
    return PrefixCache(
        Pool("blocks", num_blocks),
        Pool("slots", 8),
        block_size=BLOCK,
        state_block_size=2 * BLOCK,
        max_cached_states=max_states,
        uses_blocks=True,
        uses_slots=True,
        events=events,
    )


def a_request(tokens: list[int], cache: PrefixCache) -> Request:
    """A request that has computed its tokens into blocks of its own."""
    request = Request("r", tokens, SamplingParams(max_tokens=1), seed=0)
    request.num_computed = len(tokens)
    request.block_ids = cache.allocate_blocks(len(tokens) // BLOCK)
    return request


def test_events_encode_to_vllm_schema():
    """A store of blocks and a state, an eviction: the msgpack is a positional batch of
    type-tagged maps with vLLM's keys, decodes with vLLM's schema, and its hashes are the
    documented chain of the token ids (the consumer re-hashes them)."""
    captured = Captured()
    events = RecordedEvents(captured, block_size=BLOCK, rank=3)
    cache = a_cache(events)
    tokens = list(range(100, 112))
    request = a_request(tokens, cache)
    cache.publish_blocks(request, 0)
    key = cache.state_key(request, 2 * BLOCK)
    cache.reserve_state(key)
    cache.publish_state(key, request)
    events.end_step()
    (batch,) = captured.batches
    payload = __import__("msgspec").msgpack.encode(batch.wire())
    raw = msgpack.unpackb(payload)
    assert isinstance(raw, list) and len(raw) == 3 and raw[2] == 3
    stored_blocks, stored_state = raw[1]
    assert set(stored_blocks) == STORED_KEYS and stored_blocks["type"] == "BlockStored"
    assert stored_blocks["kv_cache_spec_kind"] == "full_attention"
    assert stored_state["kv_cache_spec_kind"] == "mamba" and stored_state["group_idx"] == 1
    decoded = DECODER.decode(payload)
    assert decoded.data_parallel_rank == 3
    blocks, state = decoded.events
    assert isinstance(blocks, BlockStored) and blocks.parent_block_hash is None
    assert blocks.token_ids == tokens and blocks.block_size == BLOCK and blocks.medium == "GPU"
    assert state.block_hashes == [blocks.block_hashes[1]]  # the block ending at 8
    assert state.parent_block_hash == blocks.block_hashes[0] and state.token_ids == tokens[4:8]
    view = HeldBlocks()
    view.apply(decoded)  # checks every hash against its tokens
    assert view.groups == {0: set(cache.block_digests), 1: set(cache.published_states)}


def test_evictions_merge_and_a_reset_clears():
    """Blocks evicted for one allocation go out as one BlockRemoved of group 0; a reset that
    empties the cache is one AllBlocksCleared."""
    captured = Captured()
    events = RecordedEvents(captured, block_size=BLOCK, rank=0)
    cache = a_cache(events, num_blocks=6)
    request = a_request(list(range(20)), cache)  # 5 blocks: the whole pool
    cache.publish_blocks(request, 0)
    cache.block_pool.free(request.block_ids)  # the request is gone: the cache's alone
    events.end_step()
    cache.allocate_blocks(2)
    events.end_step()
    cache.reset()
    events.end_step()
    stored, evicted, cleared = (DECODER.decode(msgpack.packb(b.wire())) for b in captured.batches)
    (removed,) = evicted.events
    assert isinstance(removed, BlockRemoved) and removed.group_idx == KV_GROUP
    *_, third, fourth = stored.events[0].block_hashes
    assert removed.block_hashes == [fourth, third]  # the deepest first
    assert [type(e).__name__ for e in cleared.events] == ["AllBlocksCleared"]
    assert STATE_GROUP == 1


def test_publisher_frames_replay_and_rank_endpoints():
    """Rank 1 of an engine whose first rank is 2 publishes as rank 3 on the port + 3: frames
    [topic, sequence, payload]; a subscriber that joins late gets the batches it missed from
    the replay socket (the port + 3 of the replay endpoint)."""
    port, replay_port = free_port(), free_port()
    events = KVEventsConfig(
        enable_kv_cache_events=True,
        endpoint=f"tcp://*:{port - 3}",
        replay_endpoint=f"tcp://*:{replay_port - 3}",
        topic="kv",
    ).for_rank(2)
    config = EngineArgs(max_model_len=64, block_size=BLOCK, kv_events_config=events).resolved(16)
    sink = cache_events(config, 1)
    assert isinstance(sink, RecordedEvents) and sink.rank == 3
    cache = a_cache(sink)
    request = a_request(list(range(8)), cache)
    cache.publish_blocks(request, 0)
    cache.block_pool.free(request.block_ids)  # the request is gone: the cache's alone
    sink.end_step()
    subscriber = Subscriber(f"tcp://127.0.0.1:{port}", f"tcp://127.0.0.1:{replay_port}", "kv")
    try:
        missed = subscriber.replayed(0)  # joined after the first batch went out
        assert [s for s, _ in missed] == [0] and missed[0][1].data_parallel_rank == 3
        subscriber.next_sequence = 1
        cache.allocate_blocks(4)  # evicts one of the two blocks
        sink.end_step()
        ((sequence, batch),) = subscriber.receive()
        assert sequence == 1 and isinstance(batch.events[0], BlockRemoved)
    finally:
        sink.close()
        subscriber.close()


def test_rank_endpoint_follows_vllm():
    assert rank_endpoint("tcp://*:5557", 0) == "tcp://*:5557"
    assert rank_endpoint("tcp://*:5557", 2) == "tcp://*:5559"
    assert rank_endpoint("tcp://10.0.0.1:6000", 1) == "tcp://10.0.0.1:6001"
    assert rank_endpoint("inproc://cache", 1) == "inproc://cache_dp1"
    assert rank_endpoint(None, 4) is None


def test_config_and_cli_option():
    """--kv-events-config takes vLLM's JSON; publisher defaults to zmq when enabled; events
    without prefix caching and unknown fields are refused."""
    parser = argparse.ArgumentParser()
    add_engine_options(parser)
    text = '{"enable_kv_cache_events": true, "endpoint": "tcp://*:6001", "topic": "kv-events"}'
    options = engine_options(parser.parse_args(["--kv-events-config", text]))
    events = options["kv_events_config"]
    assert events == KVEventsConfig(True, "zmq", "tcp://*:6001", topic="kv-events")
    assert KVEventsConfig().publisher == "null" and not KVEventsConfig().publishes
    with pytest.raises(SystemExit):
        parser.parse_args(["--kv-events-config", '{"enable_kv_cache_event": true}'])
    args = EngineArgs(max_model_len=64, prefix_caching="off", kv_events_config=events)
    with pytest.raises(ValueError, match="needs prefix caching"):
        args.resolved(16)
    off = dataclasses.replace(args, kv_events_config={"enable_kv_cache_events": False})
    assert type(cache_events(off.resolved(16), 0)).__name__ == "CacheEvents"
