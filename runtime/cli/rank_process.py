"""A data-parallel rank's process: load the model as a one-rank `LLM`, then serve the front.

    python -m runtime.cli.rank_process <socket fd>      (started by `runtime.ranks.launch`)

Its connection to the front is the socket whose file descriptor it is given: it receives its
`RankSpec`, loads on the devices its environment shows it, says `Ready` with its `RankInfo`,
then runs `RankLoop` until the front says `Stop` or goes away. Loading or a step that fails
sends `Failed` with the cause, and the process exits with status 1.
"""

from __future__ import annotations

import logging
import sys
import traceback
from multiprocessing.connection import Connection

from runtime.llm import LLM
from runtime.ranks.launch import RankSpec
from runtime.ranks.messages import Failed, RankInfo, Ready
from runtime.ranks.worker import RankLoop

log = logging.getLogger(__name__)


def rank_info(llm: LLM) -> RankInfo:
    engine = llm.local_engine
    return RankInfo(
        config=engine.config,
        model_config=engine.model_config,
        num_params=llm.summary.num_params,
        dtype=llm.summary.dtype,
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
