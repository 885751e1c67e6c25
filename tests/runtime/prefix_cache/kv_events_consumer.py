"""A KV events consumer as a router writes one: vLLM's documented schema, decoded by msgspec.

The types are the wire schema of vLLM's KV events (map-encoded events, vllm#42892: a positional
batch [ts, events, data_parallel_rank], each event a map tagged by "type"), written here from
that schema, not imported from runtime/: a test that decodes with them checks our encoding
against the schema, not against itself. `Subscriber` is a real ZMQ SUB socket (and a DEALER
socket for replays); `HeldBlocks` is a router's index of what one engine rank holds.
"""

from __future__ import annotations

import dataclasses
import hashlib

import msgspec
import zmq


class EventBatch(msgspec.Struct, array_like=True, omit_defaults=True, gc=False):
    ts: float
    events: list[BlockStored | BlockRemoved | AllBlocksCleared]
    data_parallel_rank: int | None = None


class KVCacheEvent(msgspec.Struct, omit_defaults=True, gc=False, tag=True):
    """vLLM's tagged union: the tag is the class name under the "type" key."""


class BlockStored(KVCacheEvent):
    block_hashes: list[bytes | int]
    parent_block_hash: bytes | int | None
    token_ids: list[int]
    block_size: int
    lora_id: int | None
    medium: str | None
    lora_name: str | None
    extra_keys: list[tuple | None] | None = None
    group_idx: int | None = None
    kv_cache_spec_kind: str | None = None
    kv_cache_spec_sliding_window: int | None = None


class BlockRemoved(KVCacheEvent):
    block_hashes: list[bytes | int]
    medium: str | None
    group_idx: int | None = None


class AllBlocksCleared(KVCacheEvent):
    pass


DECODER = msgspec.msgpack.Decoder(EventBatch)


def chained_digest(parent: bytes | None, token_ids: list[int]) -> bytes:
    """The documented block hash: blake2b-128 over the parent's hash and the block's ids as
    little-endian int32 (runtime/prefix_cache/events.py's docstring)."""
    h = hashlib.blake2b(parent or b"", digest_size=16)
    h.update(b"".join(t.to_bytes(4, "little", signed=True) for t in token_ids))
    return h.digest()


@dataclasses.dataclass
class HeldBlocks:
    """A router's index of one rank: the block hashes each group holds."""

    groups: dict[int, set[bytes]] = dataclasses.field(default_factory=dict)
    kinds: dict[int, str] = dataclasses.field(default_factory=dict)

    def apply(self, batch: EventBatch) -> None:
        for event in batch.events:
            if isinstance(event, BlockStored):
                self._store(event)
            elif isinstance(event, BlockRemoved):
                held = self.groups.setdefault(event.group_idx or 0, set())
                assert set(event.block_hashes) <= held, "removed a block never stored"
                held.difference_update(event.block_hashes)
            else:
                self.groups.clear()

    def _store(self, event: BlockStored) -> None:
        """Check each hash against the tokens (a router re-hashes them), then hold it."""
        size, parent = event.block_size, event.parent_block_hash
        assert len(event.token_ids) == size * len(event.block_hashes)
        for i, digest in enumerate(event.block_hashes):
            assert isinstance(digest, bytes) and isinstance(parent, bytes | None)
            assert digest == chained_digest(parent, event.token_ids[i * size : (i + 1) * size])
            parent = digest
        group = event.group_idx or 0
        self.kinds[group] = event.kv_cache_spec_kind or "full_attention"
        self.groups.setdefault(group, set()).update(event.block_hashes)

    def hit_tokens(self, prompt: list[int], block_size: int, state_block_size: int) -> int:
        """The longest prefix a hybrid rank can start after: every KV block of it held (group
        0) and the state at its end (group 1), all but the last prompt token."""
        kv, states = self.groups.get(0, set()), self.groups.get(1, set())
        parent, best = None, 0
        for i in range((len(prompt) - 1) // block_size):
            parent = chained_digest(parent, prompt[i * block_size : (i + 1) * block_size])
            if parent not in kv:
                break
            end = (i + 1) * block_size
            if end % state_block_size == 0 and parent in states:
                best = end
        return best


class Subscriber:
    """A SUB socket on a publisher's endpoint, and a DEALER socket on its replay endpoint."""

    def __init__(self, endpoint: str, replay: str | None, topic: str) -> None:
        context = zmq.Context.instance()
        self.sub = context.socket(zmq.SUB)
        self.sub.setsockopt(zmq.SUBSCRIBE, topic.encode())
        self.sub.connect(endpoint)
        self.replay = None
        if replay is not None:
            # DEALER, not REQ: a REQ socket takes one reply per request, and a replay is many.
            self.replay = context.socket(zmq.DEALER)
            self.replay.connect(replay)
        self.topic = topic.encode()
        self.next_sequence = 0

    def receive(self, timeout_ms: int = 2000) -> list[tuple[int, EventBatch]]:
        """The next message, preceded by the ones missed before it (asked of the replay
        socket, as a router does when it sees a gap); [] when none comes in time. A message
        already had from a replay is skipped."""
        sequence = -1
        while sequence < self.next_sequence:
            if not self.sub.poll(timeout_ms):
                return []
            topic, sequence_bytes, payload = self.sub.recv_multipart()
            assert topic == self.topic
            sequence = int.from_bytes(sequence_bytes, "big")
        missed = self.replayed(self.next_sequence) if sequence > self.next_sequence else []
        missed = [(s, b) for s, b in missed if s < sequence]
        assert [s for s, _ in missed] == list(range(self.next_sequence, sequence))
        self.next_sequence = sequence + 1
        return [*missed, (sequence, DECODER.decode(payload))]

    def receive_or_replay(self) -> list[tuple[int, EventBatch]]:
        """The next message, or, when none comes (a subscriber joining late misses the first
        ones and nothing follows them), what the replay socket has from the next one on."""
        batches = self.receive() or self.replayed(self.next_sequence)
        if batches:
            self.next_sequence = batches[-1][0] + 1
        return batches

    def replayed(self, first: int) -> list[tuple[int, EventBatch]]:
        """The batches from sequence number `first` on that the replay socket still has."""
        assert self.replay is not None, "a gap in the sequence numbers and no replay socket"
        self.replay.send_multipart([b"", first.to_bytes(8, "big")])  # REQ's envelope, by hand
        batches = []
        while self.replay.poll(2000):
            empty, sequence_bytes, payload = self.replay.recv_multipart()
            assert empty == b""
            if not payload:  # the end marker: sequence number -1, empty payload
                assert int.from_bytes(sequence_bytes, "big", signed=True) == -1
                return batches
            batches.append((int.from_bytes(sequence_bytes, "big"), DECODER.decode(payload)))
        raise AssertionError("the replay socket did not finish")

    def close(self) -> None:
        self.sub.close(linger=0)
        if self.replay is not None:
            self.replay.close(linger=0)
