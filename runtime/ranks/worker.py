"""The rank process: one data-parallel rank's engine, driven by the front over a connection.

    python -m runtime.ranks.worker <socket fd>      (started by `runtime.ranks.launch`)

Its connection to the front is the socket whose file descriptor it is given; it receives its
`RankSpec`, loads the model as a one-rank `LLM` on the devices its environment shows it, says
`Ready`, then runs `RankLoop` until the front says `Stop` or goes away.
"""

from __future__ import annotations

import logging
import sys
import threading
import time
import traceback
from multiprocessing.connection import Connection

from runtime.engine import Engine
from runtime.llm import LLM
from runtime.ranks.launch import RankSpec
from runtime.ranks.messages import (
    Abort,
    Add,
    Failed,
    FrontMessage,
    RankInfo,
    Ready,
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

log = logging.getLogger(__name__)

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
        self._sending = threading.Lock()  # the warm-up's progress thread sends too

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
            self.conn.send(StatsReply(self.engine.stats, self.engine.num_variants))
        elif isinstance(message, Warmup):
            self._warm_up(message)

    def _warm_up(self, message: Warmup) -> None:
        """Warm up, sending snapshots (its progress) from a thread meanwhile; then `WarmedUp`."""
        done = threading.Event()

        def report() -> None:
            while not done.wait(SNAPSHOT_SECONDS):
                with self._sending:
                    self.conn.send(Snapshot(self.engine.snapshot()))

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


def rank_info(llm: LLM) -> RankInfo:
    engine = llm.local_engine
    return RankInfo(
        config=engine.config,
        model_config=engine.model_config,
        num_params=llm.summary.num_params,
        dtype=llm.summary.dtype,
        num_programs=engine.num_variants,
        snapshot=engine.snapshot(),
        checkpoint_seconds=llm.checkpoint_seconds,
        setup_seconds=engine.runner.setup_seconds,
    )


def serve(conn: Connection) -> int:
    """Load, say `Ready`, serve; the process's exit status (1 when loading or a step failed)."""
    spec: RankSpec = conn.recv()
    try:
        llm = LLM(spec.model, dtype=spec.dtype, warmup=spec.warmup, **spec.options)
        conn.send(Ready(rank_info(llm)))
        RankLoop(llm.local_engine, conn).run()
    except Exception as error:  # loading or a step: tell the front why, then exit
        log.exception("rank %d failed", spec.rank)
        detail = "".join(traceback.format_exception_only(error)).strip()
        try:
            conn.send(Failed(f"rank {spec.rank}: {detail}"))
        except OSError:
            pass
        return 1
    return 0


def main() -> int:
    with Connection(int(sys.argv[1])) as conn:
        return serve(conn)


if __name__ == "__main__":
    sys.exit(main())
