"""`ZmqPublisher`: sends a rank's cache event batches over ZMQ, as vLLM's KV event publisher does.

A PUB socket sends each batch as [topic, sequence number (8 bytes, big-endian), msgpack payload]
(the payload's schema: runtime/prefix_cache/events.py). A subscriber that sees a gap in the
sequence numbers asks the replay socket (ROUTER, when `replay_endpoint` is set) for the batches
from a sequence number on: it sends [b"", that number as 8 big-endian bytes] (a REQ socket's
envelope) and gets one [b"", sequence number, payload] message per batch still buffered, then
[b"", -1 (8 bytes, signed), b""]: vLLM's frames. The replies are many, so the subscriber's socket
is a DEALER (a REQ socket keeps only the first reply).

ZMQ sockets belong to one thread, so one thread owns both: the engine's thread only puts batches
on a queue (encoding and sending cost it nothing), and the replay socket is answered while the
engine is idle too. Imported only when events are on: it needs pyzmq and msgspec (`pip install
'jmamba[events]'`).
"""

from __future__ import annotations

import logging
import queue
import threading
import weakref
from collections import deque

from runtime.core.kv_events_config import KVEventsConfig, rank_endpoint
from runtime.prefix_cache.events import EventBatch

try:
    import msgspec
    import zmq
except ImportError as error:  # events asked for without the extra
    raise ImportError(
        f"kv events need pyzmq and msgspec: pip install 'jmamba[events]' ({error})"
    ) from None

log = logging.getLogger(__name__)

END_OF_REPLAY = (-1).to_bytes(8, "big", signed=True)
POLL_SECONDS = 0.05  # how often the thread looks at the replay socket while no batch comes
CLOSE_SECONDS = 2.0  # how long `close` waits for queued batches to go out
LINGER_MS = 200  # how long a closed PUB socket still sends what it holds


def binds(endpoint: str) -> bool:
    """Whether the publisher binds `endpoint` (a wildcard address, ipc or inproc) or connects
    to it (a subscriber's or proxy's address): vLLM's rule."""
    wildcard = "*" in endpoint or "::" in endpoint
    return wildcard or endpoint.startswith(("ipc://", "inproc://"))


class ZmqPublisher:
    """Publishes `EventBatch`es of data-parallel rank `rank` on its endpoint (module docstring).

    Attributes:
      endpoint / replay_endpoint: the rank's addresses (`config`'s, offset by the rank).
    """

    def __init__(self, config: KVEventsConfig, rank: int) -> None:
        self.endpoint = rank_endpoint(config.endpoint, rank)
        self.replay_endpoint = rank_endpoint(config.replay_endpoint, rank)
        assert self.endpoint is not None  # a config's endpoint is a str
        self._sender = _Sender(config, self.endpoint, self.replay_endpoint)
        self._thread = threading.Thread(
            target=self._sender.run, name=f"kv-events-{rank}", daemon=True
        )
        self._thread.start()
        # An engine has no close of its own: a publisher dropped unclosed stops its thread (the
        # thread holds the sender, not the publisher), which closes the sockets.
        weakref.finalize(self, self._sender.queue.put, None)

    def publish(self, batch: EventBatch) -> None:
        """Queue `batch`; it goes out in order, with the next sequence number. A full queue (no
        thread sending: it died) drops the batch with a warning rather than stall the engine."""
        try:
            self._sender.queue.put_nowait(batch)
        except queue.Full:
            log.warning("kv events: queue full, batch of %d events dropped", len(batch.events))

    def close(self) -> None:
        """Send what is queued (waiting up to CLOSE_SECONDS), then close the sockets."""
        self._sender.queue.put(None)
        self._thread.join(CLOSE_SECONDS)


class _Sender:
    """The publisher thread's sockets, queue and replay buffer (only that thread uses them)."""

    def __init__(self, config: KVEventsConfig, endpoint: str, replay: str | None) -> None:
        self.topic = config.topic.encode()
        self.queue: queue.Queue[EventBatch | None] = queue.Queue(config.max_queue_size)
        self.buffer: deque[tuple[int, bytes]] = deque(maxlen=config.buffer_steps)
        context: zmq.Context = zmq.Context.instance()
        self.pub = context.socket(zmq.PUB)
        self.pub.set_hwm(config.hwm)
        self.replay: zmq.Socket | None = None
        try:
            (self.pub.bind if binds(endpoint) else self.pub.connect)(endpoint)
            if replay is not None:
                self.replay = context.socket(zmq.ROUTER)
                self.replay.bind(replay)
        except zmq.ZMQError as error:
            self.close_sockets()
            raise ValueError(f"kv events: cannot open {endpoint} / {replay}: {error}") from None

    def run(self) -> None:
        """Send queued batches and answer replay requests until a None is queued."""
        encoder = msgspec.msgpack.Encoder()
        sequence = 0
        try:
            while True:
                self.answer_replays()
                try:
                    batch = self.queue.get(timeout=POLL_SECONDS)
                except queue.Empty:
                    continue
                if batch is None:
                    return
                payload = encoder.encode(batch.wire())
                self.pub.send_multipart((self.topic, sequence.to_bytes(8, "big"), payload))
                self.buffer.append((sequence, payload))
                sequence += 1
        finally:
            self.close_sockets()

    def answer_replays(self) -> None:
        """Answer each waiting replay request with the buffered batches it asks for."""
        while self.replay is not None and self.replay.poll(0):
            frames = self.replay.recv_multipart()
            if len(frames) != 3:  # [identity, empty delimiter, first sequence number]
                log.warning("kv events: replay request of %d frames ignored", len(frames))
                continue
            client, _, first = frames
            start = int.from_bytes(first, "big")
            for sequence, payload in list(self.buffer):
                if sequence >= start:
                    self.replay.send_multipart((client, b"", sequence.to_bytes(8, "big"), payload))
            self.replay.send_multipart((client, b"", END_OF_REPLAY, b""))

    def close_sockets(self) -> None:
        self.pub.close(linger=LINGER_MS)
        if self.replay is not None:
            self.replay.close(linger=0)
