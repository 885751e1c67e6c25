"""The decode instance of test_two_processes.py, in a process of its own: a model built as the
parent builds it, its own runner and caches, hand-overs read from a pipe (the local transport),
and what it made sent back to the parent."""

from __future__ import annotations

from multiprocessing.connection import Connection  # noqa: E402

import tests.conftest  # noqa: F401  (first: the test run's JAX settings, before jax starts)
from runtime.device.memory import resolve_config  # noqa: E402
from runtime.device.model_runner import ModelRunner  # noqa: E402
from runtime.disagg import ConnectionTransport, DecodeInstance  # noqa: E402
from runtime.disagg.pool_rows import engine_pool_rows  # noqa: E402
from runtime.engine import Engine  # noqa: E402
from tests.runtime.disagg.pairs import (  # noqa: E402
    engine_args,
    finished,
    free_counts,
    load,
)


def serve(name: str, handovers: Connection, results: Connection, num_requests: int) -> None:
    """Admit `num_requests` hand-overs, decode them, and send back (free counts before, the
    rows after admission and after `DECODE_STEPS_COMPARED` decode steps, the tokens, free
    counts after)."""
    model = load(name)
    args = engine_args(model.config.chunk_size)
    engine = Engine(model, args, runner=ModelRunner(model, resolve_config(model, args)))
    decode = DecodeInstance(engine, ConnectionTransport(handovers))
    start = free_counts(engine)
    ids: list[str] = []
    while len(ids) < num_requests:
        arrivals = decode.receive(timeout=60.0)
        assert not arrivals.failed, arrivals.failed
        ids += arrivals.admitted
    done = finished(engine, engine_pool_rows(engine), ids)
    results.send((start, done.after_prompt, done.after_decodes, done.tokens, free_counts(engine)))
