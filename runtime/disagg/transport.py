"""`Transport`: how hand-overs travel from a prefill instance to a decode instance, and
`TransferError`, what a lost or failed transfer raises, `FailedRequest`, how it is reported
(no jax).

Two implementations sit behind it: `runtime.disagg.local.ConnectionTransport` (a
`multiprocessing` connection: a pipe or a local socket between two processes; tests, one host)
and `runtime.disagg.nixl.NixlTransport` (NIXL, imported only when made; untested here). The
instances never ask which one they hold.
"""

from __future__ import annotations

import dataclasses
from typing import Protocol

from runtime.disagg.handover import Handover


class TransferError(RuntimeError):
    """A hand-over was lost or refused: the peer is gone, the bytes were cut short or corrupt,
    none arrived in time, or the peer's fingerprint differs. `request_id` names the request
    when it is known; `link_lost`: the link itself is gone (nothing more will come over it)."""

    def __init__(
        self, message: str, request_id: str | None = None, *, link_lost: bool = False
    ) -> None:
        super().__init__(message)
        self.request_id = request_id
        self.link_lost = link_lost


@dataclasses.dataclass(frozen=True)
class FailedRequest:
    """A request a hand-over failed for: its id ("?" when the bytes did not say) and the error,
    for the caller to report."""

    request_id: str
    error: str


class Transport(Protocol):
    """One direction of a prefill -> decode link."""

    def send(self, handover: Handover) -> None:
        """Deliver `handover` to the peer (returns once the transport holds it; the sender may
        free the request's blocks and slot then); TransferError if it cannot."""

    def receive(self, timeout: float) -> Handover | None:
        """The next hand-over, waiting at most `timeout` seconds (None: nothing came);
        TransferError when the link is gone or what came is not a hand-over."""

    def close(self) -> None:
        """Release the link (both ends may call it)."""
