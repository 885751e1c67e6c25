"""`NixlTransport`: hand-overs through NIXL (NVIDIA's inference transfer library), the decode side
pulling the rows with one READ. UNTESTED: NIXL is not installed here and needs UCX and a NIC or
NVLink; nothing in CI imports this module's NIXL calls (the import is inside `__init__`).

Per hand-over: the sender registers the rows' buffers with its agent, sends the peer a
notification holding the hand-over's header (`Handover.header`) and the serialized descriptors
of those buffers, and waits until the peer's READ of them completes (the READ carries the
completion tag, which NIXL delivers to the sender) before deregistering; only then does `send`
return, so the prefill instance frees nothing the peer still reads. The receiver allocates and
registers buffers of the header's dtypes and shapes, READs into them and builds the `Handover`,
which the same admission path then writes into its caches.

What this leaves for a GPU run: the rows travel from the prefill engine's staging copy
(`PoolRows.read` brings them to the host) to the decode side's host buffers, then to its
device. Registering the pools themselves (each cache leaf's device buffer, "VRAM") and sending
block and slot lists, as vLLM's connector does, would skip both host copies; it needs each
leaf's device pointer (`jax.Array.unsafe_buffer_pointer()` per shard) to stay put across steps,
which donation keeps in practice (the step aliases each cache to its output) but nothing
guarantees, so it would re-register whenever a pointer moved.
"""

from __future__ import annotations

import json
import time
from typing import Any

import numpy as np

from runtime.disagg.handover import Handover
from runtime.disagg.transport import TransferError

_OFFER, _DONE = b"H", b"D"  # notification kinds: a hand-over's header, a READ's completion


class NixlTransport:
    """A `Transport` between two NIXL agents (`agent_name` here, `peer_name` there), each made
    on its own side; exchange `metadata()` out of band and `add_peer` the other's."""

    def __init__(self, agent_name: str, peer_name: str, *, timeout: float = 30.0) -> None:
        """`timeout`: the most seconds `send` waits for the peer's READ."""
        from nixl._api import nixl_agent, nixl_agent_config  # NIXL only where it is installed

        self.agent: Any = nixl_agent(agent_name, nixl_agent_config(backends=["UCX"]))
        self.peer_name = peer_name
        self.timeout = timeout
        self._offers: list[bytes] = []  # notifications taken while waiting for something else

    def metadata(self) -> bytes:
        """This agent's metadata, for the peer's `add_peer`."""
        return bytes(self.agent.get_agent_metadata())

    def add_peer(self, metadata: bytes) -> None:
        """Know the peer (its `metadata()`)."""
        self.agent.add_remote_agent(metadata)

    def send(self, handover: Handover) -> None:
        arrays = [np.ascontiguousarray(a) for a in (*handover.block_rows, *handover.slot_rows)]
        registered = self.agent.register_memory(arrays)  # host buffers ("DRAM")
        try:
            descs = self.agent.get_xfer_descs(arrays)
            offer = {"header": handover.header(), "descs": self.agent.get_serialized_descs(descs)}
            self.agent.send_notif(self.peer_name, _OFFER + _encode(offer))
            tag = _DONE + handover.request_id.encode()
            deadline = time.monotonic() + self.timeout
            while not self.agent.check_remote_xfer_done(self.peer_name, tag):
                if time.monotonic() > deadline:
                    raise TransferError(
                        f"request {handover.request_id!r}: the decode side did not read its "
                        f"rows within {self.timeout} s",
                        handover.request_id,
                    )
                time.sleep(0.0005)
        finally:
            self.agent.deregister_memory(registered)

    def receive(self, timeout: float) -> Handover | None:
        offer = self._next_offer(timeout)
        if offer is None:
            return None
        header = offer["header"]
        arrays = [np.empty(shape, np.dtype(dtype)) for dtype, shape in header["arrays"]]
        registered = self.agent.register_memory(arrays)
        try:
            local = self.agent.get_xfer_descs(arrays)
            remote = self.agent.deserialize_descs(offer["descs"])
            tag = _DONE + str(header["request_id"]).encode()
            handle = self.agent.initialize_xfer("READ", local, remote, self.peer_name, tag)
            try:
                self._wait(handle, str(header["request_id"]))
            finally:
                self.agent.release_xfer_handle(handle)
        finally:
            self.agent.deregister_memory(registered)
        return Handover.from_header(header, arrays)

    def close(self) -> None:
        self.agent.remove_remote_agent(self.peer_name)

    def _next_offer(self, timeout: float) -> dict[str, Any] | None:
        """The oldest hand-over header the peer offered, waiting up to `timeout` seconds."""
        deadline = time.monotonic() + timeout
        while not self._offers:
            notifs = self.agent.get_new_notifs().get(self.peer_name, [])
            self._offers += [bytes(m)[1:] for m in notifs if bytes(m)[:1] == _OFFER]
            if self._offers or time.monotonic() >= deadline:
                break
            time.sleep(0.0005)
        if not self._offers:
            return None
        try:
            return _decode(self._offers.pop(0))
        except ValueError as e:
            raise TransferError(f"a corrupt hand-over offer arrived: {e}") from e

    def _wait(self, handle: Any, request_id: str) -> None:
        state = self.agent.transfer(handle)
        while state != "DONE":
            if state == "ERR":
                raise TransferError(f"request {request_id!r}: the NIXL READ failed", request_id)
            time.sleep(0.0005)
            state = self.agent.check_xfer_state(handle)


def _encode(offer: dict[str, Any]) -> bytes:
    """An offer as bytes: the JSON header, a newline, the serialized descriptors."""
    return json.dumps(offer["header"]).encode() + b"\n" + bytes(offer["descs"])


def _decode(data: bytes) -> dict[str, Any]:
    text, _, descs = data.partition(b"\n")
    try:
        return {"header": json.loads(text), "descs": descs}
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ValueError(str(e)) from e
