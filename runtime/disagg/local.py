"""The local transports, for one host and tests (no jax): `ConnectionTransport`, hand-overs over
a `multiprocessing` connection between two processes, and `QueueTransport`, both ends in one
process.

The connection is either end of `multiprocessing.Pipe()` (two processes started by one parent,
or one process: `local_pair`) or a local socket between unrelated processes (`listen` on the
decode side, `connect` on the prefill side; `multiprocessing.connection`'s authkey handshake
keeps strangers out). Each hand-over is one message: its wire form (`Handover.to_bytes`: a JSON
header and raw numpy bytes, never pickle, so a peer cannot make the receiver run code). The
contents cross through host memory: this is the transport for CPU tests and a fallback, not for
GPU-to-GPU speed (`runtime.disagg.nixl` is that). A pipe holds about 64 kB: `send` blocks until
the decode side reads (backpressure), so both ends of one pipe in one process would deadlock on
any real hand-over; `QueueTransport` is that case, the same bytes in a queue.
"""

from __future__ import annotations

import collections
import multiprocessing
import time
from multiprocessing.connection import Client, Connection, Listener

from runtime.disagg.handover import Handover
from runtime.disagg.transport import TransferError

Address = tuple[str, int] | str  # (host, port) or a Unix socket path


class ConnectionTransport:
    """A `Transport` over one `multiprocessing.connection.Connection`."""

    def __init__(self, connection: Connection) -> None:
        self.connection = connection

    def send(self, handover: Handover) -> None:
        try:
            self.connection.send_bytes(handover.to_bytes())
        except (OSError, EOFError, ValueError) as e:  # closed, broken pipe, reset
            raise TransferError(
                f"hand-over of request {handover.request_id!r} not sent: the link is gone "
                f"({type(e).__name__}: {e})",
                handover.request_id,
                link_lost=True,
            ) from e

    def receive(self, timeout: float) -> Handover | None:
        try:
            if not self.connection.poll(timeout):
                return None
            data = self.connection.recv_bytes()
        except (OSError, EOFError) as e:
            message = f"the prefill link is gone ({type(e).__name__}: {e})"
            raise TransferError(message, link_lost=True) from e
        try:
            return Handover.from_bytes(data)
        except ValueError as e:
            raise TransferError(f"a corrupt hand-over arrived: {e}") from e

    def close(self) -> None:
        self.connection.close()


class QueueTransport:
    """A `Transport` whose two ends are one object in one process: each hand-over is queued in
    its wire form (so a test exercises the same encoding), `receive` takes the oldest."""

    def __init__(self) -> None:
        self.queue: collections.deque[bytes] = collections.deque()
        self.closed = False

    def send(self, handover: Handover) -> None:
        if self.closed:
            raise TransferError(
                f"hand-over of request {handover.request_id!r} not sent: the link is closed",
                handover.request_id,
                link_lost=True,
            )
        self.queue.append(handover.to_bytes())

    def receive(self, timeout: float) -> Handover | None:
        if not self.queue:
            time.sleep(timeout)  # nothing else can fill it meanwhile: one process
            if not self.queue:
                return None
        try:
            return Handover.from_bytes(self.queue.popleft())
        except ValueError as e:
            raise TransferError(f"a corrupt hand-over arrived: {e}") from e

    def close(self) -> None:
        self.closed = True


def local_pair() -> tuple[ConnectionTransport, ConnectionTransport]:
    """(prefill end, decode end) of one pipe: hand one end to a child process (both in one
    process would block: `QueueTransport`)."""
    receiving, sending = multiprocessing.Pipe(duplex=False)
    return ConnectionTransport(sending), ConnectionTransport(receiving)


def listen(address: Address, authkey: bytes) -> Listener:
    """The decode side's listener; `accept(listener)` waits for a prefill instance."""
    return Listener(address, authkey=authkey)


def accept(listener: Listener) -> ConnectionTransport:
    """The next prefill instance's link (blocks until one connects)."""
    return ConnectionTransport(listener.accept())


def connect(address: Address, authkey: bytes) -> ConnectionTransport:
    """The prefill side's link to a decode instance listening at `address`."""
    return ConnectionTransport(Client(address, authkey=authkey))
