"""Host CPU time of a pure-decode engine step, split by part (issue 12: the host side of a step).

The engine of the `decode` bench (B requests of 16-token prompts, warmed up, one prefill step,
then pure decode) runs with its compiled step replaced by a stub that returns constant tokens, so
only the host's work runs: schedule, agree (bucket and sampling mode), snapshot (the step
record's copy of the schedule), build, postprocess (the scheduler's advance and retire),
verify (splitting the lanes into accepted drafts), drafter (its bookkeeping), record. Times are
CPU seconds of this thread (`time.thread_time`), which other processes on a loaded machine do
not inflate the way they inflate wall time; each part is the sum of its calls, "other" the rest
of `Engine.step`.

`--drafts K` runs the asynchronous MTP engine of `speculation spec_decode --async-scheduling`
instead (the tiny model with a random head): every step drafts K tokens a row and the stub
accepts every draft, so each row runs 1 + K lanes a step. Requests are long enough never to
finish while timed. With `--max-batch-size M` as well, the MTP engine drafts only while at most
M requests run (`SpeculativeConfig.max_batch_size`): at B > M every step is its step without
drafts, to compare with the plain engine's under `--async-scheduling`.

    python -m benchmarks.engine profile_host --batches 1,16,64,256 --steps 1000 [--drafts 2]
    python -m benchmarks.engine profile_host --batches 16,64 --async-scheduling
    python -m benchmarks.engine profile_host --batches 16,64 --drafts 1 --max-batch-size 1
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import time
from collections.abc import Callable

import numpy as np

from benchmarks.harness.models import build_model
from benchmarks.harness.serving import PROMPT_LEN, make_engine
from runtime import engine as engine_module
from runtime.core.speculative_config import SpeculativeConfig
from runtime.device.step_result import StepResult
from runtime.engine import Engine
from runtime.observe.step_record import ScheduleRecord

WARM_STEPS = 8  # the prefill step, then decode steps before timing
PARTS = ("schedule", "agree", "snapshot", "build", "postprocess", "verify", "drafter", "record")


class _StubRunner:
    """Stands for `runner`'s `dispatch` / `fetch` (and `dispatch_steps` / `fetch_steps`, one
    `dispatch` a step): token 7 for every logits row; with
    `num_drafts` K, every draft accepted and, from a drafting step, K drafts (7 each) at every
    column (`StepResult.drafts`)."""

    def __init__(self, runner, num_drafts: int) -> None:
        self.runner, self.num_drafts = runner, num_drafts
        self._fetch = runner.fetch  # for the real step still in flight (asynchronous engine)
        self.runner_fetch_steps = runner.fetch_steps

    def dispatch(self, bucket, batches, **options):
        return bucket, len(batches), self.num_drafts if options.get("drafts", True) else 0

    def dispatch_steps(self, bucket, parts, **options):
        return [self.dispatch(bucket, batches, **options) for batches in parts]

    def fetch_steps(self, dispatched) -> list[StepResult]:
        if not isinstance(dispatched, list):
            return self.runner_fetch_steps(dispatched)
        return [self.fetch(step) for step in dispatched]

    def fetch(self, dispatched) -> StepResult:
        if not isinstance(dispatched, tuple):
            return self._fetch(dispatched)
        bucket, num_batches, num_drafts = dispatched
        tokens = np.full(bucket.num_logits, 7, np.int32)
        accepted = np.full(bucket.num_logits, 1 if self.num_drafts else 0, np.int32)
        drafts = np.full((1 + num_drafts, bucket.num_logits), 7, np.int32)
        drafts[0] = num_drafts  # the count row of the drafts
        return StepResult(
            tokens=[tokens] * num_batches,
            accepted=[accepted] * num_batches,
            drafts=[drafts] * num_batches if num_drafts else None,
            logprobs=None,
            logits=None,
        )


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
    planner = engine.planner
    planner._agree = _timed(seconds, "agree", planner._agree)
    planner._build = _timed(seconds, "build", planner._build)
    engine._record = _timed(seconds, "record", engine._record)
    drafter = engine.drafter
    for name in ("propose", "dispatched", "observe", "release_done"):
        setattr(drafter, name, _timed(seconds, "drafter", getattr(drafter, name)))
    stub = _StubRunner(engine.runner, engine.runner.drafter.num_drafts)
    engine.runner.dispatch, engine.runner.fetch = stub.dispatch, stub.fetch
    engine.runner.dispatch_steps, engine.runner.fetch_steps = stub.dispatch_steps, stub.fetch_steps


def profile_batch(
    model,
    batch: int,
    steps: int,
    num_drafts: int = 0,
    max_batch_size: int | None = None,
    async_scheduling: bool = False,
) -> dict:
    """Host CPU ms per step of `steps` pure-decode steps at `batch` rows, per part (the MTP
    engine, always asynchronous, with `num_drafts` > 0)."""
    lanes = (1 + num_drafts) * (steps + WARM_STEPS)  # the most tokens a request gains
    max_model_len = -(-(PROMPT_LEN + lanes + 64) // 256) * 256
    speculative = (
        SpeculativeConfig("mtp", num_drafts, max_batch_size=max_batch_size) if num_drafts else None
    )
    engine = make_engine(
        model,
        batch,
        steps + WARM_STEPS,
        max_model_len,
        async_scheduling=async_scheduling or speculative is not None,
        speculative=speculative,
    )
    engine.step()  # the prefill step, with the real runner (compiles it)
    seconds: collections.Counter = collections.Counter(dict.fromkeys(PARTS, 0.0))
    _instrument(engine, seconds)
    record_of, verify = ScheduleRecord.of, engine_module.verified_tokens
    ScheduleRecord.of = _timed(seconds, "snapshot", record_of)  # type: ignore[method-assign]
    engine_module.verified_tokens = _timed(seconds, "verify", verify)
    try:
        for _ in range(WARM_STEPS - 1):
            engine.step()
        seconds.clear()
        start = time.thread_time()
        for _ in range(steps):
            engine.step()
        total = time.thread_time() - start
    finally:
        ScheduleRecord.of, engine_module.verified_tokens = record_of, verify  # type: ignore
    if len(engine.inspect.scheduler.running) != batch:
        raise RuntimeError("a request finished while timed: the steps were not all decode steps")
    parts = {name: 1e3 * s / steps for name, s in seconds.items()}
    parts["other"] = 1e3 * total / steps - sum(parts.values())
    return dict(
        batch=batch,
        drafts=num_drafts,
        host_cpu_ms=1e3 * total / steps,
        parts={k: round(v, 4) for k, v in parts.items()},
    )


def main(argv: list[str] | None = None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", default="1,16,64,256")
    parser.add_argument("--steps", type=int, default=1000)
    parser.add_argument("--drafts", type=int, default=0, help="K: the MTP engine drafting K")
    parser.add_argument("--max-batch-size", type=int, default=None, help="the MTP engine's")
    parser.add_argument("--async-scheduling", action="store_true", help="the plain engine too")
    args = parser.parse_args(argv)
    # The host's work does not depend on the model's size.
    model = build_model("tiny", mtp=args.drafts > 0)
    rows = []
    for batch in (int(b) for b in args.batches.split(",")):
        options = dict(max_batch_size=args.max_batch_size, async_scheduling=args.async_scheduling)
        rows.append(profile_batch(model, batch, args.steps, args.drafts, **options))
        parts = ", ".join(f"{k} {v:.3f}" for k, v in rows[-1]["parts"].items())
        print(f"B={batch:4d} host {rows[-1]['host_cpu_ms']:.3f} CPU ms/step: {parts}", flush=True)
    if os.environ.get("OUT"):
        with open(os.path.join(os.environ["OUT"], "profile_host.json"), "w") as f:
            json.dump(rows, f, indent=1)
    return rows
