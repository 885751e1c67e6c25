"""Cache events: what a rank's prefix cache stores and drops, in vLLM's KV events schema.

KV-aware routers (llm-d's KV cache indexer, NVIDIA Dynamo's KV router) keep an index of which
prefixes each engine holds from the events vLLM publishes. A rank here publishes the same events,
so those routers index jmamba ranks unchanged; `runtime/prefix_cache/publisher.py` sends them.

Wire format (vLLM's since vllm#42892, the map-encoded events): each message is three ZMQ frames,
[topic, sequence number (8 bytes, big-endian, from 0), payload], one message per engine step
that changed the cache. The payload is msgpack of the batch, a positional array

    [ts (float, seconds since the epoch), [event, ...], data_parallel_rank (int)]

and each event a msgpack map tagged by its "type" key:

    {"type": "BlockStored", "block_hashes": [bin, ...], "parent_block_hash": bin | nil,
     "token_ids": [int, ...], "block_size": int, "lora_id": nil, "medium": "GPU",
     "lora_name": nil, "group_idx": int, "kv_cache_spec_kind": str}
    {"type": "BlockRemoved", "block_hashes": [bin, ...], "medium": "GPU", "group_idx": int}
    {"type": "AllBlocksCleared"}

Block hashes are our 16-byte chained digests (runtime/prefix_cache/cache.py), sent as msgpack
bin: vLLM's `ExternalBlockHash` is bytes or int, and its sha256 hashes go out as bytes too. The
digest of block i is d_i = blake2b(d_{i-1} || token ids of block i as little-endian int32,
digest_size=16), d_{-1} = b"", so a router may recompute it from the token ids. A BlockStored
names consecutive blocks of one prefix: `parent_block_hash` is the block before the first (nil at
the prompt's start) and `token_ids` the blocks' tokens, block_size each.

Hybrid models: two groups, as vLLM's hybrid KV cache manager has one group per layer kind (its
`group_idx` and `kv_cache_spec_kind` fields, vllm#37688 and #40984):

- group 0, kind "full_attention": the attention KV blocks, one hash per block;
- group 1, kind "mamba" (vLLM's kind for every recurrent state, Mamba2 and Gated DeltaNet alike):
  the recurrent states. A state at position p summarises the prefix [0, p) and is keyed by the
  digest of the KV block ending at p, so its event names that one block (its hash, its parent,
  its block_size tokens) with group_idx 1, exactly as vLLM's mamba group caches the state of a
  block under that block's hash. States exist only at multiples of state_block_size; the events
  say where by the hashes they name.

Why this lets a router route hybrids exactly (Dynamo runs vLLM hybrids with --no-kv-events, since
KV blocks alone overstate a hit): a rank can start a request after its first p tokens only where
it holds every KV block of [0, p) (group 0) and the state at p (group 1). A router that hashes
the prompt's blocks once finds the longest such p from its index of the two groups; that is the
rank's own lookup (`PrefixCache.lookup`, which also leaves the last prompt token to compute). A
model without attention publishes group 1 only; one without recurrent layers group 0 only.

The cache reports through a `CacheEvents` sink that is always present: `CacheEvents` itself
records nothing (events off), `RecordedEvents` batches a step's events and hands the batch to a
publisher. Host side only, no jax; nothing here imports zmq or msgpack.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Sequence
from typing import Any, Protocol

from runtime.core.request import Request

MEDIUM = "GPU"  # vLLM's medium for blocks in device memory
KV_GROUP, STATE_GROUP = 0, 1
GROUP_KINDS = {KV_GROUP: "full_attention", STATE_GROUP: "mamba"}


@dataclasses.dataclass(frozen=True)
class BlockStored:
    """Consecutive blocks of one prefix that a group now holds (module docstring)."""

    block_hashes: tuple[bytes, ...]
    parent_block_hash: bytes | None
    token_ids: tuple[int, ...]
    block_size: int
    group_idx: int

    def wire(self) -> dict[str, Any]:
        """The event as vLLM encodes it (a map tagged by "type"; defaults left out)."""
        return {
            "type": "BlockStored",
            "block_hashes": list(self.block_hashes),
            "parent_block_hash": self.parent_block_hash,
            "token_ids": list(self.token_ids),
            "block_size": self.block_size,
            "lora_id": None,
            "medium": MEDIUM,
            "lora_name": None,
            "group_idx": self.group_idx,
            "kv_cache_spec_kind": GROUP_KINDS[self.group_idx],
        }


@dataclasses.dataclass(frozen=True)
class BlockRemoved:
    """Blocks a group no longer holds (evicted)."""

    block_hashes: tuple[bytes, ...]
    group_idx: int

    def wire(self) -> dict[str, Any]:
        return {
            "type": "BlockRemoved",
            "block_hashes": list(self.block_hashes),
            "medium": MEDIUM,
            "group_idx": self.group_idx,
        }


@dataclasses.dataclass(frozen=True)
class AllBlocksCleared:
    """Every group holds nothing any more (a reset that emptied the cache)."""

    def wire(self) -> dict[str, Any]:
        return {"type": "AllBlocksCleared"}


CacheEvent = BlockStored | BlockRemoved | AllBlocksCleared


@dataclasses.dataclass(frozen=True)
class EventBatch:
    """One step's events of one rank, in order."""

    ts: float
    events: tuple[CacheEvent, ...]
    data_parallel_rank: int

    def wire(self) -> list[Any]:
        """The batch as vLLM encodes it: a positional array [ts, events, data_parallel_rank]."""
        return [self.ts, [event.wire() for event in self.events], self.data_parallel_rank]


class Publisher(Protocol):
    """Where batches go (`runtime.prefix_cache.publisher.ZmqPublisher`)."""

    def publish(self, batch: EventBatch) -> None: ...

    def close(self) -> None: ...


class CacheEvents:
    """The sink a prefix cache reports to. This base records nothing: events are off."""

    def stored(
        self, group: int, chain: Sequence[bytes], first: int, stop: int, request: Request
    ) -> None:
        """Blocks first .. stop - 1 of `request`, whose digests are `chain[first:stop]`, are
        now held by `group` (chain[first - 1] is their parent)."""

    def state_stored(self, chain: Sequence[bytes], key: bytes, request: Request) -> None:
        """The state of `key` is now held: `request`'s state after the block whose digest in
        `chain` (its digests) is `key`."""

    def removed(self, group: int, digest: bytes) -> None:
        """The block `digest` of `group` was evicted."""

    def cleared(self) -> None:
        """The cache holds nothing any more."""

    def end_step(self) -> None:
        """A step has retired: what it changed goes out as one batch."""

    def close(self) -> None:
        """Stop publishing (sockets closed)."""


class RecordedEvents(CacheEvents):
    """Records a step's events and publishes them as one `EventBatch` at its end.

    Consecutive removals of one group merge into one `BlockRemoved`, as vLLM's block pool sends
    an eviction's blocks together. A step that changed nothing publishes nothing.
    """

    def __init__(self, publisher: Publisher, *, block_size: int, rank: int) -> None:
        self.publisher, self.block_size, self.rank = publisher, block_size, rank
        self.pending: list[CacheEvent] = []
        self.num_published = 0  # batches handed to the publisher

    def stored(
        self, group: int, chain: Sequence[bytes], first: int, stop: int, request: Request
    ) -> None:
        bs = self.block_size
        parent = chain[first - 1] if first else None
        tokens = tuple(request.token_ids(first * bs, stop * bs))
        self.pending.append(BlockStored(tuple(chain[first:stop]), parent, tokens, bs, group))

    def state_stored(self, chain: Sequence[bytes], key: bytes, request: Request) -> None:
        i = _last_index(chain, key, request.num_computed // self.block_size)
        self.stored(STATE_GROUP, chain, i, i + 1, request)

    def removed(self, group: int, digest: bytes) -> None:
        last = self.pending[-1] if self.pending else None
        if isinstance(last, BlockRemoved) and last.group_idx == group:
            self.pending[-1] = BlockRemoved((*last.block_hashes, digest), group)
        else:
            self.pending.append(BlockRemoved((digest,), group))

    def cleared(self) -> None:
        self.pending.append(AllBlocksCleared())

    def end_step(self) -> None:
        if not self.pending:
            return
        batch = EventBatch(time.time(), tuple(self.pending), self.rank)
        self.pending = []
        self.publisher.publish(batch)
        self.num_published += 1

    def close(self) -> None:
        self.end_step()
        self.publisher.close()


def _last_index(chain: Sequence[bytes], key: bytes, hint: int) -> int:
    """The index of `key` in `chain`, searched from `hint` down first: a state is published
    right after the step that computed it, so it lies just below the request's computed blocks
    (the chain may reach its whole prompt: a lookup hashed it)."""
    for i in range(min(hint, len(chain) - 1), -1, -1):
        if chain[i] == key:
            return i
    return chain.index(key, hint + 1)  # above it: computed past what the host knows (async)
