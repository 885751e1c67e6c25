"""`KVEventsConfig`: whether and where each rank publishes its prefix cache's events (no jax).

The fields and their defaults are vLLM's `--kv-events-config` (a JSON object), so the routers that
read vLLM's KV events (llm-d, NVIDIA Dynamo) are configured the same way for jmamba. What is
published and how: runtime/prefix_cache/events.py (the events), runtime/prefix_cache/publisher.py
(the ZMQ sockets).
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any

from runtime.core import checks

PUBLISHERS = ("null", "zmq")


@dataclasses.dataclass(frozen=True)
class KVEventsConfig:
    """Prefix cache events, vLLM's fields and defaults.

    Attributes:
      enable_kv_cache_events: publish events (False: a no-op sink, nothing imported).
      publisher: "zmq" (a PUB socket) or "null" (record nothing); None: "zmq" when events are
        enabled, else "null" (vLLM's default).
      endpoint: the PUB socket's address; one with "*" (or "::", ipc://, inproc://) is bound,
        another is connected to. Rank r of a data-parallel engine publishes on the port + r
        (inproc: the name + "_dp{r}"), as vLLM's ranks do.
      replay_endpoint: a ROUTER socket's address from which a subscriber that missed batches asks
        for them again (an 8-byte big-endian first sequence number); None: no replay. Offset per
        rank like `endpoint`.
      buffer_steps: batches kept for replay.
      hwm: the PUB socket's high-water mark (messages queued for a slow subscriber).
      max_queue_size: batches waiting for the publisher's thread.
      topic: the first frame of every message (subscribers filter on its prefix).
      data_parallel_rank: the data-parallel rank of the engine's first rank (not vLLM's field:
        vLLM reads it from its parallel config). `RankGroup` sets it for each rank process; an
        engine over several ranks (one process, or a multi-host group) publishes rank r's events
        as rank data_parallel_rank + r.
    """

    enable_kv_cache_events: bool = False
    publisher: str | None = None
    endpoint: str = "tcp://*:5557"
    replay_endpoint: str | None = None
    buffer_steps: int = 10_000
    hwm: int = 100_000
    max_queue_size: int = 100_000
    topic: str = ""
    data_parallel_rank: int = 0

    def __post_init__(self) -> None:
        checks.flag("enable_kv_cache_events", self.enable_kv_cache_events)
        if self.publisher is None:  # frozen: set once, as vLLM's __post_init__ does
            default = "zmq" if self.enable_kv_cache_events else "null"
            object.__setattr__(self, "publisher", default)
        checks.choice("publisher", self.publisher, PUBLISHERS)
        for name in ("buffer_steps", "hwm", "max_queue_size"):
            checks.integer(name, getattr(self, name), low=1)
        checks.integer("data_parallel_rank", self.data_parallel_rank, low=0)
        for name in ("endpoint", "topic"):
            if not isinstance(getattr(self, name), str):
                raise ValueError(f"kv_events_config {name}={getattr(self, name)!r} must be a str")
        replay = self.replay_endpoint
        if replay is not None and not isinstance(replay, str):
            raise ValueError(f"kv_events_config replay_endpoint={replay!r} must be a str or None")

    @classmethod
    def of(cls, value: KVEventsConfig | dict[str, Any] | str | None) -> KVEventsConfig | None:
        """`value` as a config: itself, a dict of its fields, or that dict as JSON text (the
        `--kv-events-config` option); None stays None. ValueError naming unknown fields."""
        if value is None or isinstance(value, KVEventsConfig):
            return value
        if isinstance(value, str):
            try:
                value = json.loads(value)
            except json.JSONDecodeError as error:
                raise ValueError(f"kv_events_config is not JSON: {error}") from None
        if not isinstance(value, dict):
            raise ValueError(f"kv_events_config={value!r} must be a JSON object of its fields")
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(value) - known)
        if unknown:
            raise ValueError(f"kv_events_config: unknown fields {unknown}; known: {sorted(known)}")
        return cls(**value)

    @property
    def publishes(self) -> bool:
        """Whether a rank records and sends events (enabled, and a publisher other than null)."""
        return self.enable_kv_cache_events and self.publisher != "null"

    def for_rank(self, rank: int) -> KVEventsConfig:
        """This config for the engine whose first rank is `rank` (a rank process's)."""
        return dataclasses.replace(self, data_parallel_rank=rank)


def rank_endpoint(endpoint: str | None, rank: int) -> str | None:
    """`endpoint` for data-parallel rank `rank`: the TCP port + rank, an inproc name + "_dp{rank}"
    (vLLM's rule, so a router subscribes to every rank of a vLLM or jmamba engine alike)."""
    if endpoint is None or rank == 0:
        return endpoint
    if endpoint.startswith("inproc://"):
        return f"{endpoint}_dp{rank}"
    if endpoint.startswith("tcp://"):
        base, _, port = endpoint.rpartition(":")
        return f"{base}:{int(port) + rank}"
    raise ValueError(
        f"kv_events_config endpoint={endpoint!r}: a rank > 0 needs tcp:// or inproc://"
    )
