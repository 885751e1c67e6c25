"""`DecodeInstance`: an engine that takes prefilled requests from a transport and decodes them.

`receive()` takes what has arrived and admits each (`admission.admit_handover`): a request that
finds no room waits in arrival order and is retried first next time; one that is refused (another
fingerprint, rows that do not fit, an id in use) or whose bytes are corrupt fails with the error;
a request its first token finished is returned finished. `expect(request_id, within)` names a
request the router sent here: if no hand-over for it arrives in time it fails too (a lost
transfer), so a caller waiting on it is answered. The engine is stepped as any engine; its
outputs are the requests' outputs, first token included.
"""

from __future__ import annotations

import collections
import dataclasses
import time

from runtime.disagg.admission import admit_handover, check_handover
from runtime.disagg.fingerprint import Fingerprint
from runtime.disagg.handover import Handover
from runtime.disagg.pool_rows import PoolRows, engine_pool_rows
from runtime.disagg.transport import FailedRequest, TransferError, Transport
from runtime.engine import Engine
from runtime.outputs.request_output import RequestOutput


@dataclasses.dataclass(frozen=True)
class Arrivals:
    """What one `DecodeInstance.receive` did.

    Attributes:
      admitted: ids of the requests now running here.
      finished: requests their first token finished on the prefill side.
      failed: requests lost or refused, with the error.
    """

    admitted: list[str]
    finished: list[RequestOutput]
    failed: list[FailedRequest]


class DecodeInstance:
    """A decode engine and the transport from its prefill instance.

    Attributes:
      engine: the engine (speculative decoding off: a draft model's state is not handed over).
      fingerprint: what a hand-over must carry (`Fingerprint`; the same `label` as the peer's).
      waiting: hand-overs that found no room yet, oldest first.
    """

    def __init__(self, engine: Engine, transport: Transport, *, label: str = "") -> None:
        if engine.config.speculative is not None:
            raise ValueError("a decode instance cannot draft yet: the drafter's state is not sent")
        self.engine = engine
        self.transport = transport
        self.rows: PoolRows = engine_pool_rows(engine)
        self.fingerprint = Fingerprint.of(
            engine.model_config, engine.config, self.rows.row_layout, label
        )
        self.waiting: collections.deque[Handover] = collections.deque()
        self._deadlines: dict[str, float] = {}

    def expect(self, request_id: str, within: float) -> None:
        """Fail request `request_id` if its hand-over has not arrived `within` seconds from now."""
        self._deadlines[request_id] = time.monotonic() + within

    def receive(self, timeout: float = 0.0) -> Arrivals:
        """Admit what has arrived, waiting up to `timeout` seconds for the first hand-over."""
        arrivals = Arrivals([], [], [])
        self._admit_waiting(arrivals)
        wait = timeout
        while True:
            try:
                handover = self.transport.receive(wait)
            except TransferError as e:  # corrupt bytes: the next message may be fine
                arrivals.failed.append(FailedRequest(e.request_id or "?", str(e)))
                if e.link_lost:
                    break
                wait = 0.0
                continue
            if handover is None:
                break
            self._deadlines.pop(handover.request_id, None)
            self._take(handover, arrivals)
            wait = 0.0  # then whatever else is already there
        self._fail_overdue(arrivals)
        return arrivals

    def _take(self, handover: Handover, arrivals: Arrivals) -> None:
        """Admit, finish, queue or fail one arrival."""
        try:
            if handover.finish_reason is not None:
                arrivals.finished.append(self._finished(handover))
            elif self.waiting or not self._admit(handover, arrivals):
                self.waiting.append(handover)
        except TransferError as e:
            arrivals.failed.append(FailedRequest(handover.request_id, str(e)))

    def _admit(self, handover: Handover, arrivals: Arrivals) -> bool:
        request = admit_handover(self.engine, self.rows, self.fingerprint, handover)
        if request is not None:
            arrivals.admitted.append(request.request_id)
        return request is not None

    def _admit_waiting(self, arrivals: Arrivals) -> None:
        """Admit the waiting hand-overs oldest first while they find room."""
        while self.waiting:
            try:
                if not self._admit(self.waiting[0], arrivals):
                    return
            except TransferError as e:
                arrivals.failed.append(FailedRequest(self.waiting[0].request_id, str(e)))
            self.waiting.popleft()

    def _finished(self, handover: Handover) -> RequestOutput:
        """The output of a request its first token finished on the prefill side (its times are
        the prefill instance's to tell: none here)."""
        check_handover(self.engine, self.rows, self.fingerprint, handover)
        return RequestOutput(
            request_id=handover.request_id,
            prompt_token_ids=list(handover.prompt_token_ids),
            token_ids=list(handover.output_token_ids),
            finish_reason=str(handover.finish_reason),
            time_to_first_token=None,
            latency=0.0,
        )

    def _fail_overdue(self, arrivals: Arrivals) -> None:
        now = time.monotonic()
        for request_id, deadline in list(self._deadlines.items()):
            if now >= deadline:
                del self._deadlines[request_id]
                error = f"request {request_id!r}: no hand-over arrived in time (lost transfer)"
                arrivals.failed.append(FailedRequest(request_id, error))
