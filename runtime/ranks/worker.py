"""The rank process: one data-parallel rank's engine, driven by the front over a connection.

    python -m runtime.ranks.worker <socket fd>      (started by `runtime.ranks.launch`)

Its connection to the front is the socket whose file descriptor it is given; it receives its
`RankSpec`, loads the model as a one-rank `LLM` on the devices its environment shows it, says
`Ready`, then runs `RankLoop` until the front says `Stop` or goes away.
"""

from __future__ import annotations

import logging
import sys
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
    StatsReply,
    StatsRequest,
    Stepped,
    Stop,
    Streaming,
)

log = logging.getLogger(__name__)


class RankLoop:
    """Take the front's messages, step while requests are unfinished, send what each step gave.

    Messages are read between steps (all that wait, without blocking while there is work); with
    nothing to do the loop sleeps on the connection. A step's finished outputs (or, streaming,
    its deltas) go back in one `Stepped`. A failing step sends `Failed` and ends the loop.
    """

    def __init__(self, engine: Engine, conn: Connection) -> None:
        self.engine = engine
        self.conn = conn
        self.streaming = False

    def run(self) -> None:
        while self._receive(block=not self.engine.has_unfinished):
            if self.engine.has_unfinished:
                self._step()

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
        elif isinstance(message, Abort):
            self.engine.abort(message.request_id)
        elif isinstance(message, Streaming):
            self.streaming = message.on
        elif isinstance(message, StatsRequest):
            self.conn.send(StatsReply(self.engine.stats, self.engine.num_variants))

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
