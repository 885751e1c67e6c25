"""`PrefillInstance`: an engine that computes prompts and hands each request over after its
first token.

Its requests run as on any engine; after every `step()` each one that reached its prompt's end
(`export.is_prefilled`) is exported (its rows read from the device), aborted here (its blocks and
slot freed at once, whatever the transfer does), then sent. A request its first token finished
(a stop token, `max_tokens=1`) is sent as finished. A send that fails fails that request: it is
returned in `step()`'s failures with the transport's error, and nothing of it stays here. The
engine must schedule synchronously: after an asynchronous step the next one is already on the
device, feeding the first token into the rows being read.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from runtime.core.sampling_params import SamplingParams
from runtime.disagg.export import export_handover, finished_handover, is_prefilled
from runtime.disagg.fingerprint import Fingerprint
from runtime.disagg.handover import Handover, carried_params
from runtime.disagg.pool_rows import PoolRows, engine_pool_rows
from runtime.disagg.transport import FailedRequest, TransferError, Transport
from runtime.engine import Engine


@dataclasses.dataclass(frozen=True)
class PrefillStep:
    """What one `PrefillInstance.step` did.

    Attributes:
      sent: the hand-overs delivered to the transport, in order.
      failed: requests whose hand-over could not be sent (nothing of them is left here).
    """

    sent: list[Handover]
    failed: list[FailedRequest]


class PrefillInstance:
    """A prefill engine and the transport to its decode instance.

    Attributes:
      engine: the engine (synchronous scheduling).
      fingerprint: what a decode instance must match (`Fingerprint`).
    """

    def __init__(self, engine: Engine, transport: Transport, *, label: str = "") -> None:
        """`label` names the weights in the fingerprint (the decode side must give the same)."""
        if engine.config.async_scheduling:
            raise ValueError("a prefill instance's engine needs async_scheduling=False")
        self.engine = engine
        self.transport = transport
        self.rows: PoolRows = engine_pool_rows(engine)
        self.fingerprint = Fingerprint.of(
            engine.model_config, engine.config, self.rows.row_layout, label
        )
        self._prefilling: dict[str, list[int]] = {}  # live request id -> its prompt

    def add_request(
        self,
        prompt_token_ids: Sequence[int],
        sampling_params: SamplingParams | None = None,
        request_id: str | int | None = None,
    ) -> str:
        """Queue a request to prefill here and decode on the peer; returns its id. ValueError,
        and nothing queued, for what `Engine.add_request` refuses or a hand-over cannot carry
        (`handover.carried_params`)."""
        carried_params(sampling_params or SamplingParams())
        request_id = self.engine.add_request(prompt_token_ids, sampling_params, request_id)
        self._prefilling[request_id] = list(prompt_token_ids)
        return request_id

    @property
    def has_unfinished(self) -> bool:
        """Whether a request is still prefilling here."""
        return bool(self._prefilling)

    def step(self) -> PrefillStep:
        """One engine step, then hand over every request it brought to its first token."""
        finished = self.engine.step()
        handovers: list[Handover] = []
        for output in finished:  # its first token ended it: nothing left to decode
            prompt = self._prefilling.pop(output.request_id, None)
            if prompt is None:
                continue  # not one of ours (added to the engine directly)
            handovers.append(
                finished_handover(
                    output.request_id,
                    output.token_ids,
                    prompt,
                    output.finish_reason,
                    self.fingerprint.digest,
                )
            )
        for request_id in list(self._prefilling):
            if is_prefilled(self.engine.request(request_id)):
                handovers.append(self._export(request_id))
        return self._send(handovers)

    def _export(self, request_id: str) -> Handover:
        """Read the request's rows, then free it here (before any transfer can fail)."""
        try:
            handover = export_handover(self.engine, self.rows, self.fingerprint.digest, request_id)
        finally:
            self.engine.abort(request_id)
            del self._prefilling[request_id]
        return handover

    def _send(self, handovers: list[Handover]) -> PrefillStep:
        sent, failed = [], []
        for handover in handovers:
            try:
                self.transport.send(handover)
                sent.append(handover)
            except TransferError as e:
                failed.append(FailedRequest(handover.request_id, str(e)))
        return PrefillStep(sent, failed)
