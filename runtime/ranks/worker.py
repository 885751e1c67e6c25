"""`RankLoop`: a rank process's loop around its one-rank engine (the process itself is
`runtime.cli.rank_process`, which loads the engine and hands it the connection)."""

from __future__ import annotations

import threading
import time
from multiprocessing.connection import Connection

from runtime.engine import Engine
from runtime.ranks.messages import (
    Abort,
    Add,
    FrontMessage,
    Refused,
    Snapshot,
    StatsReply,
    StatsRequest,
    Stepped,
    Stop,
    Streaming,
    WarmedUp,
    Warmup,
)

SNAPSHOT_SECONDS = 0.25  # a busy rank sends its engine's snapshot at most this often


class RankLoop:
    """Take the front's messages, step while requests are unfinished, send what each step gave.

    Messages are read between steps (all that wait, without blocking while there is work); with
    nothing to do the loop sleeps on the connection. A step's finished outputs (or, streaming,
    its deltas) go back in one `Stepped`, and the engine's `Snapshot` at most every
    SNAPSHOT_SECONDS and whenever it goes idle. A failing step sends `Failed` and ends the loop.
    """

    def __init__(self, engine: Engine, conn: Connection) -> None:
        self.engine = engine
        self.conn = conn
        self.streaming = False
        self._sent_snapshot = 0.0

    def run(self) -> None:
        while self._receive(block=not self.engine.has_unfinished):
            if self.engine.has_unfinished:
                self._step()
                self._send_snapshot(due=not self.engine.has_unfinished)

    def _send_snapshot(self, due: bool = False) -> None:
        now = time.perf_counter()
        if due or now - self._sent_snapshot >= SNAPSHOT_SECONDS:
            self.conn.send(Snapshot(self.engine.snapshot()))
            self._sent_snapshot = now

    def _receive(self, block: bool) -> bool:
        """Handle every waiting message (wait for one if `block`); False on `Stop` or when the
        front has gone."""
        try:
            while self.conn.poll(None if block else 0):
                message = self.conn.recv()
                if isinstance(message, Stop):
                    return False
                self._handle(message)
                block = False
        except (EOFError, OSError):  # the front process is gone: nothing to serve
            return False
        return True

    def _handle(self, message: FrontMessage) -> None:
        if isinstance(message, Add):
            self._add(message)
        elif isinstance(message, Abort):  # its blocks and slot go back now: say so
            self.engine.abort(message.request_id)
            self._send_snapshot(due=True)
        elif isinstance(message, Streaming):
            self.streaming = message.on
        elif isinstance(message, StatsRequest):
            self.conn.send(StatsReply(self.engine.stats))
        elif isinstance(message, Warmup):
            self._warm_up(message)

    def _warm_up(self, message: Warmup) -> None:
        """Warm up, sending snapshots (its progress) from a thread meanwhile; then `WarmedUp`."""
        done = threading.Event()

        def report() -> None:
            while not done.wait(SNAPSHOT_SECONDS):
                self.conn.send(Snapshot(self.engine.snapshot()))  # the one sender meanwhile

        reporter = threading.Thread(target=report, name="jmamba-warmup-progress", daemon=True)
        reporter.start()
        try:
            self.engine.warmup(
                prefill=message.prefill, sampled=message.sampled, workers=message.workers
            )
        finally:
            done.set()
            reporter.join()
        self.conn.send(WarmedUp(self.engine.snapshot()))

    def _add(self, message: Add) -> None:
        for request_id, prompt, params in zip(
            message.request_ids, message.prompts, message.params, strict=True
        ):
            try:
                self.engine.add_request(prompt, params, request_id)
            except ValueError as error:
                self.conn.send(Refused(request_id, error))

    def _step(self) -> None:
        items = self.engine.step_deltas() if self.streaming else self.engine.step()
        if items:
            self.conn.send(Stepped(items))
