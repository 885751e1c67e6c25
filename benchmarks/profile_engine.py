"""Where the decode step's time goes: kernels per step, GPU busy time, transfers, XLA flags.

For each variant (XLA_FLAGS and allocator settings: one subprocess each, since they are read when
the backend starts)
and each batch size, on a random bench model of `bench_engine.py` (`--size`: 1b NemotronH-shaped,
qwen3next, or their tiny twins):

* engine: `Engine.step()` wall time split into host and device (as `bench_engine.py`);
* runner, numpy inputs: the compiled step called with the step's numpy inputs, tokens fetched;
* runner, device inputs: the same with inputs already on the device (the difference is transfers);
* pipelined: N calls with no sync between them (GPU-bound when dispatch is shorter than the GPU);
* profile: kernels per step, GPU busy time per step, the top kernels, the host events of the
  step's call (where its launch time goes), and busy time by part of the step (attention, each
  mixer, MLP / MoE, lm_head, sampler: the named scopes the model sets, read from the HLO metadata
  of each kernel's instruction); jax.profiler trace parsed with `jax.profiler.ProfileData`;
* HLO: instructions of the compiled decode step by opcode, custom-call targets, command buffers.

    python benchmarks/profile_engine.py --size tiny --batches 4 --variants default   # CPU smoke
    python benchmarks/profile_engine.py                                              # GPU
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

if __package__ in (None, ""):  # run as `python benchmarks/<script>.py`: the repo root on the path
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks.engine.hlo import hlo_stats, instruction_parts  # noqa: E402
from benchmarks.engine.profile_report import print_table  # noqa: E402
from benchmarks.engine.runner_timing import device_inputs, time_runner  # noqa: E402
from benchmarks.engine.trace import (  # noqa: E402
    host_events,
    load_trace,
    profile_events,
    summarize_host,
    summarize_profile,
)
from benchmarks.engine.variants import VARIANTS, child_env  # noqa: E402


def run_variant(size: str, batches: list[int], steps: int, out: str, name: str) -> list[dict]:
    import jax
    import numpy as np

    from benchmarks.engine.models import build_model
    from benchmarks.engine.serving import make_engine

    model = build_model(size)
    rows = []
    for batch in batches:
        engine = make_engine(model, batch, steps)
        for _ in range(4):
            engine.step()
        row = {"variant": name, "batch": batch}
        h0, d0, t0 = engine.stats.host_seconds, engine.stats.device_seconds, time.perf_counter()
        for _ in range(steps):
            engine.step()
        row["engine_step_ms"] = 1e3 * (time.perf_counter() - t0) / steps
        row["engine_host_ms"] = 1e3 * (engine.stats.host_seconds - h0) / steps
        row["engine_device_ms"] = 1e3 * (engine.stats.device_seconds - d0) / steps
        runner, batch_in = engine.runner, engine.inspect.last_batch
        bucket = engine.buckets.bucket_for(engine.inspect.last_schedule)
        compiled = runner._compiled[runner._variant(bucket, [batch_in], carry=False, drafts=True)]
        row.update(time_runner(runner, bucket, batch_in, steps, np, jax))
        trace_dir = tempfile.mkdtemp()
        dev = device_inputs(runner, bucket, batch_in, jax)
        with jax.profiler.trace(trace_dir):
            for _ in range(10):
                step = runner.dispatch(bucket, [batch_in], dev)
            np.asarray(step.tokens)
        text = compiled.as_text()
        try:
            trace = load_trace(trace_dir)
            row["profile"] = summarize_profile(profile_events(trace), 10, instruction_parts(text))
            row["profile"]["host"] = summarize_host(host_events(trace), 10)
        except Exception as error:  # keep the timings if the trace cannot be parsed
            row["profile"] = {"error": repr(error)}
        row["hlo"] = hlo_stats(text)
        if name == "default":  # at most 8 files come back from the device machine
            with open(os.path.join(out, f"hlo_{name}_b{batch}.txt"), "w") as f:
                f.write(text)
        print(json.dumps({k: v for k, v in row.items() if k not in ("profile", "hlo")}), flush=True)
        rows.append(row)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--size", default="1b", help="a bench_engine.py size")
    parser.add_argument("--batches", default="1,64")
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--variants", default=",".join(VARIANTS))
    parser.add_argument("--child", default=None)
    args = parser.parse_args()
    out = os.environ.get("OUT") or tempfile.mkdtemp()
    os.makedirs(out, exist_ok=True)
    batches = [int(b) for b in args.batches.split(",")]
    if args.child:
        rows = run_variant(args.size, batches, args.steps, out, args.child)
        with open(os.path.join(out, f"profile_{args.child}.json"), "w") as f:
            json.dump(rows, f, indent=1)
        return
    for name in args.variants.split(","):
        env = child_env(name, out)
        cmd = [
            sys.executable,
            __file__,
            "--size",
            args.size,
            "--batches",
            args.batches,
            "--steps",
            str(args.steps),
            "--child",
            name,
        ]
        print(f"== {name}: {VARIANTS[name]}", flush=True)
        if "TF_CPP_VMODULE" in VARIANTS[name]:  # the log goes to a file of its own
            with open(os.path.join(out, f"vlog_{name}.txt"), "w") as log:
                subprocess.run(cmd, env=env, check=False, stderr=log)
        else:
            subprocess.run(cmd, env=env, check=False)
    print_table(out, args.variants.split(","))


if __name__ == "__main__":
    main()
