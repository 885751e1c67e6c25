"""Host CPU time of a pure-decode engine step, split by part (issue 12: the host side of a step).

The engine of `bench_engine.py` (B requests of 16-token prompts, warmed up, one prefill step, then
pure decode) runs with its compiled step replaced by a stub that returns constant tokens, so
only the host's work runs: schedule, agree (bucket and sampling mode), snapshot (the step
record's copy of the schedule), build, postprocess (the scheduler's advance and retire),
record. Times are CPU seconds of this thread (`time.thread_time`), which other processes on a
loaded machine do not inflate the way they inflate wall time; each part is the sum of its
calls, "other" the rest of `Engine.step`.

    python benchmarks/profile_host.py --batches 1,16,64,256 --steps 1000
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import time
from collections.abc import Callable

import numpy as np

from benchmarks.engine.models import build_model
from benchmarks.engine.serving import make_engine
from runtime import engine as engine_module
from runtime.engine import Engine

WARM_STEPS = 8  # the prefill step, then decode steps before timing


class _StubRunner:
    """Stands for `ModelRunner.dispatch` / `fetch`: token 7 for every logits row, nothing
    accepted."""

    @staticmethod
    def dispatch(bucket, batches, **options):
        return bucket, len(batches)

    @staticmethod
    def fetch(dispatched) -> list[np.ndarray]:
        bucket, num_batches = dispatched
        tokens = np.zeros((2, bucket.num_logits), np.int32)
        tokens[0] = 7
        return [tokens] * num_batches


def _timed(seconds: collections.Counter, name: str, fn: Callable) -> Callable:
    def timed(*args, **kwargs):
        start = time.thread_time()
        result = fn(*args, **kwargs)
        seconds[name] += time.thread_time() - start
        return result

    return timed


def _instrument(engine: Engine, seconds: collections.Counter) -> None:
    """Wrap the parts of `engine.step` (instance attributes shadow the methods)."""
    scheduler = engine.inspect.scheduler
    scheduler.schedule = _timed(seconds, "schedule", scheduler.schedule)
    scheduler.advance = _timed(seconds, "postprocess", scheduler.advance)
    scheduler.retire = _timed(seconds, "postprocess", scheduler.retire)
    engine._agree = _timed(seconds, "agree", engine._agree)
    engine._build = _timed(seconds, "build", engine._build)
    engine._record = _timed(seconds, "record", engine._record)
    engine.runner.dispatch, engine.runner.fetch = _StubRunner.dispatch, _StubRunner.fetch


def profile_batch(model, batch: int, steps: int) -> dict:
    """Host CPU ms per step of `steps` pure-decode steps at `batch` rows, per part."""
    engine = make_engine(model, batch, steps + WARM_STEPS)
    engine.step()  # the prefill step, with the real runner (compiles it)
    seconds: collections.Counter = collections.Counter()
    _instrument(engine, seconds)
    record_of = engine_module.ScheduleRecord.of
    engine_module.ScheduleRecord.of = _timed(seconds, "snapshot", record_of)
    try:
        for _ in range(WARM_STEPS - 1):
            engine.step()
        seconds.clear()
        start = time.thread_time()
        for _ in range(steps):
            engine.step()
        total = time.thread_time() - start
    finally:
        engine_module.ScheduleRecord.of = record_of
    parts = {name: 1e3 * s / steps for name, s in seconds.items()}
    parts["other"] = 1e3 * total / steps - sum(parts.values())
    return dict(
        batch=batch,
        host_cpu_ms=1e3 * total / steps,
        parts={k: round(v, 4) for k, v in parts.items()},
    )


def main(argv: list[str] | None = None) -> list[dict]:
    parser = argparse.ArgumentParser()
    parser.add_argument("--batches", default="1,16,64,256")
    parser.add_argument("--steps", type=int, default=1000)
    args = parser.parse_args(argv)
    model = build_model("tiny")  # the host's work does not depend on the model's size
    rows = []
    for batch in (int(b) for b in args.batches.split(",")):
        rows.append(profile_batch(model, batch, args.steps))
        parts = ", ".join(f"{k} {v:.3f}" for k, v in rows[-1]["parts"].items())
        print(f"B={batch:4d} host {rows[-1]['host_cpu_ms']:.3f} CPU ms/step: {parts}", flush=True)
    if os.environ.get("OUT"):
        with open(os.path.join(os.environ["OUT"], "profile_host.json"), "w") as f:
            json.dump(rows, f, indent=1)
    return rows


if __name__ == "__main__":
    main()
