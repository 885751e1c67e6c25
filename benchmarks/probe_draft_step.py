"""Where a drafting step's time goes: host or device (issue 27, the 1.8x goal at B = 1).

For each batch size and method of `bench_spec_decode.py --size stdlib --async-scheduling`
(`none`, `mtp-K`), an engine serves B held-out prompts; once every row decodes, `--steps`
engine steps are timed:

* engine: wall ms per step, and its split (`StepStats`): host (schedule, build, retire) and
  device (the runner's dispatch and fetch; in an asynchronous engine fetch waits for the step
  before, so a device-bound engine shows its GPU time here);
* replay: the engine's last step dispatched again `--steps` times with its inputs already on
  the device, no fetch between (`pipelined`: the GPU's time per step when launches keep ahead
  of it, else the launch cost), and `dispatch`: the time until one dispatch returns;
* profile: a jax.profiler trace of 10 pipelined replays: GPU kernels per step, GPU busy ms per
  step (the sum of kernel times) and the span of a step on the GPU;
* parts: ms per step in each part of the engine's step, untraced (perf_counter around each);
* timeline: a trace of `--steps` more engine steps, the engine's parts annotated, read as the
  mean step from its dispatch's start (ms): when each host part runs, when the GPU runs the
  step's kernels (those starting before the next dispatch starts), and when the host's fetch of
  the step starts and ends (the critical path of an asynchronous step).

    PYTHONPATH=. python benchmarks/probe_draft_step.py --batches 1,16 --methods none,mtp-1,mtp-2
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import json
import os
import tempfile
import time
from collections.abc import Callable, Iterator

import jax
import numpy as np

from benchmarks.bench_spec_decode import Bench
from benchmarks.engine.trace import load_trace, profile_events, summarize_profile
from runtime.core.sampling_params import SamplingParams
from runtime.engine import Engine

PROFILED_STEPS = 10
PARTS = ("schedule", "build", "dispatch", "fetch", "retire", "advance")


def decoding_engine(bench: Bench, method: str, batch: int, max_tokens: int) -> Engine:
    """A fresh engine of `method` serving `batch` prompts, stepped until every row decodes and
    a few decode steps have run."""
    engine = bench.engine(method)
    params = SamplingParams(max_tokens=max_tokens, ignore_eos=True)
    for i, prompt in enumerate(bench.prompts[:batch]):
        engine.add_request(prompt, params, request_id=i)
    while engine.last_bucket is None or not engine.last_bucket.is_decode_only:
        engine.step()
    for _ in range(4):
        engine.step()
    return engine


def engine_ms(engine: Engine, steps: int) -> dict:
    """Wall, host and device ms per engine step over `steps` steps."""
    stats = engine.stats
    host, device, start = stats.host_seconds, stats.device_seconds, time.perf_counter()
    for _ in range(steps):
        engine.step()
    return dict(
        engine_ms=1e3 * (time.perf_counter() - start) / steps,
        host_ms=1e3 * (stats.host_seconds - host) / steps,
        device_ms=1e3 * (stats.device_seconds - device) / steps,
    )


def replay_ms(engine: Engine, steps: int) -> dict:
    """The engine's last step dispatched again with device inputs: pipelined and dispatch ms,
    and the GPU profile of `PROFILED_STEPS` pipelined steps."""
    runner, bucket, batches = engine.runner, engine.last_bucket, engine.last_batches
    carry, drafts = engine.config.async_scheduling, runner.drafter.num_drafts > 0
    key = runner._variant(bucket, batches, carry, drafts)
    packed = runner._packed(key, batches)

    def dispatch():
        return runner.dispatch(bucket, batches, packed, carry=carry, drafts=drafts)

    np.asarray(dispatch().tokens)
    start = time.perf_counter()
    for _ in range(steps):
        step = dispatch()
    np.asarray(step.tokens)
    row = dict(pipelined_ms=1e3 * (time.perf_counter() - start) / steps)
    launch = 0.0
    for _ in range(steps):
        start = time.perf_counter()
        step = dispatch()
        launch += time.perf_counter() - start
        np.asarray(step.tokens)
    row["dispatch_ms"] = 1e3 * launch / steps
    trace_dir = tempfile.mkdtemp()
    with jax.profiler.trace(trace_dir):
        for _ in range(PROFILED_STEPS):
            step = dispatch()
        np.asarray(step.tokens)
    try:
        profile = summarize_profile(profile_events(load_trace(trace_dir)), PROFILED_STEPS)
    except Exception as error:  # keep the timings if the trace cannot be read
        return row | dict(profile_error=repr(error))
    streams = [v for line, v in profile["lines"].items() if "tream" in line]
    row["kernels_per_step"] = sum(v["events_per_step"] for v in streams)
    row["gpu_busy_ms"] = sum(v["busy_ms_per_step"] for v in streams)
    row["gpu_span_ms"] = max((v["span_ms_per_step"] for v in streams), default=0.0)
    row["top_kernels"] = profile["top_kernels"][:12]
    return row


def _parts(engine: Engine) -> tuple[list, list]:
    """(object, attribute, part name) of each timed part of an engine step: the engine's own
    (its schedulers', its drafter's), and those of its runner, mesh and buffers, which later
    engines share. Parts nest: dispatch holds pack .. copy_to_host, retire holds fetch and
    sched_retire."""
    runner = engine.runner
    own = [(s, "schedule", "schedule") for s in engine.schedulers]
    own += [(s, "retire", "sched_retire") for s in engine.schedulers]
    own += [(engine, f"_{n}", n) for n in ("build", "retire", "advance")]
    own += [(engine.drafter, n, "drafter") for n in ("propose", "dispatched", "observe")]
    shared = [(runner, "dispatch", "dispatch"), (runner, "fetch", "fetch")]
    shared += [(runner, "_rows", "pack"), (runner.mesh, "global_array", "h2d")]
    shared += [(runner.buffers, "upload", "upload"), (runner.buffers, "download", "download")]
    shared += [(runner.mesh, "start_copy_to_host", "copy_to_host")]
    shared += [(runner.mesh, "local_rows", "local_rows")]
    return own, shared


@contextlib.contextmanager
def wrapped_parts(engine: Engine, wrapper: Callable[[str, Callable], Callable]) -> Iterator[None]:
    """Each part of the engine's step (`_parts`) replaced by `wrapper(name, part)` while inside
    (instance attributes shadow methods; frozen objects too); the shared ones taken off after."""
    own, shared = _parts(engine)
    for obj, attr, name in own + shared:
        object.__setattr__(obj, attr, wrapper(name, getattr(obj, attr)))
    try:
        yield
    finally:
        for obj, attr, _ in shared:
            object.__delattr__(obj, attr)


def part_times(engine: Engine, steps: int) -> dict:
    """Untraced: ms per step in each part of `steps` engine steps (perf_counter around each)."""
    totals = collections.Counter()

    def timed(name, fn):
        def call(*args, **kwargs):
            start = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                totals[name] += time.perf_counter() - start

        return call

    start = time.perf_counter()
    with wrapped_parts(engine, timed):
        for _ in range(steps):
            engine.step()
    wall = time.perf_counter() - start
    return {"wall": 1e3 * wall / steps} | {k: 1e3 * v / steps for k, v in totals.items()}


def timeline(engine: Engine, steps: int) -> dict:
    """The mean asynchronous step from its dispatch's start (module docstring), in ms."""

    def annotated(name, fn):
        def call(*args, **kwargs):
            with jax.profiler.TraceAnnotation(f"jm:{name}"):
                return fn(*args, **kwargs)

        return call

    trace_dir = tempfile.mkdtemp()
    with wrapped_parts(engine, annotated), jax.profiler.trace(trace_dir):
        for _ in range(steps):
            engine.step()
    data = load_trace(trace_dir)
    gpu = [(s, s + d) for line, _, s, d, _ in profile_events(data) if "tream" in line]
    host = [
        (event.name[3:], event.start_ns, event.start_ns + event.duration_ns)
        for plane in data.planes
        if plane.name.startswith("/host:")
        for line in plane.lines
        for event in line.events
        if event.name.startswith("jm:")
    ]
    if not gpu:  # no GPU: the host parts alone
        gpu = [(0, 0)]
    host.sort(key=lambda e: e[1])
    dispatches = [e for e in host if e[0] == "dispatch"]
    fetches = [e for e in host if e[0] == "fetch"]
    rows = []
    for i, (_, start, _) in enumerate(dispatches[1:-2], 1):
        end = dispatches[i + 1][1]
        kernels = [(s, e) for s, e in gpu if start <= s < end]
        # fetched in the engine step after the next dispatch (one step late)
        fetch = next((f for f in fetches if f[1] > dispatches[i + 1][1]), None)
        parts = {name: [e for e in host if e[0] == name and start <= e[1] < end] for name in PARTS}
        row = {
            f"{name}_ms": sum(e[2] - e[1] for e in events) / 1e6 for name, events in parts.items()
        }
        row["gpu_first_ms"] = (min(s for s, _ in kernels) - start) / 1e6 if kernels else 0.0
        row["gpu_last_ms"] = (max(e for _, e in kernels) - start) / 1e6 if kernels else 0.0
        row["gpu_busy_ms"] = sum(e - s for s, e in kernels) / 1e6
        row["next_dispatch_ms"] = (end - start) / 1e6
        if fetch is not None:
            row["fetch_start_ms"], row["fetch_end_ms"] = (
                (fetch[1] - start) / 1e6,
                (fetch[2] - start) / 1e6,
            )
        rows.append(row)
    return {key: float(np.mean([r.get(key, 0.0) for r in rows])) for key in rows[0]}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--batches", default="1,16")
    parser.add_argument("--methods", default="none,mtp-1,mtp-2,mtp-3")
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--quick", action="store_true", help="engine and parts only")
    args = parser.parse_args()
    bench_args = argparse.Namespace(
        size="stdlib",
        batches=args.batches,
        prompt_len=96,
        budget=4096,
        max_tokens=args.steps * 12 + 64,
        async_scheduling=True,
        batch_invariant=False,
    )
    bench = Bench(bench_args)
    print(f"device={jax.devices()[0].device_kind}", flush=True)
    rows = []
    for batch in bench.batches:
        for method in args.methods.split(","):
            bench.warm(method, batch)
            engine = decoding_engine(bench, method, batch, bench_args.max_tokens)
            row = dict(batch=batch, method=method) | engine_ms(engine, args.steps)
            row["parts"] = part_times(engine, args.steps)
            if not args.quick:
                row["timeline"] = timeline(engine, args.steps)
                row |= replay_ms(engine, args.steps)
            rows.append(row)
            print(json.dumps(row), flush=True)
    if os.environ.get("OUT"):
        with open(os.path.join(os.environ["OUT"], "probe_draft_step.json"), "w") as f:
            json.dump(rows, f, indent=1)
    if args.quick:
        rows = [r | dict(pipelined_ms=0.0, dispatch_ms=0.0, timeline={}) for r in rows]
    print(
        "B  method  engine ms  host ms  device ms  pipelined ms  dispatch ms  kernels  GPU busy ms"
    )
    for r in rows:
        print(
            f"{r['batch']:3d} {r['method']:7s} {r['engine_ms']:9.3f} {r['host_ms']:8.3f} "
            f"{r['device_ms']:9.3f} {r['pipelined_ms']:12.3f} {r['dispatch_ms']:11.3f} "
            f"{r.get('kernels_per_step', 0):8.0f} {r.get('gpu_busy_ms', 0):11.3f}"
        )
    print("untraced parts, ms per step:")
    for r in rows:
        line = " ".join(f"{k}={v:.3f}" for k, v in r["parts"].items())
        print(f"{r['batch']:3d} {r['method']:7s} {line}")
    print("timeline of the mean step, ms from its dispatch's start:")
    for r in rows:
        line = " ".join(f"{k.removesuffix('_ms')}={v:.3f}" for k, v in r["timeline"].items())
        print(f"{r['batch']:3d} {r['method']:7s} {line}")


if __name__ == "__main__":
    main()
