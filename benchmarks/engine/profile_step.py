"""Where the decode step's time goes: kernels per step, GPU busy time, transfers, XLA flags.

For each variant (XLA_FLAGS and allocator settings: one subprocess each, since they are read when
the backend starts) and each batch size, on a random bench model (`benchmarks/harness/models.py`,
`--size`: 1b NemotronH-shaped, qwen3next, or their tiny twins):

* engine: `Engine.step()` wall time split into host and device (as the `decode` bench);
* runner, numpy inputs: the compiled step called with the step's numpy inputs, tokens fetched;
* runner, device inputs: the same with inputs already on the device (the difference is transfers);
* pipelined: N calls with no sync between them (GPU-bound when dispatch is shorter than the GPU);
* profile: kernels per step, GPU busy time per step, the top kernels, the host events of the
  step's call (where its launch time goes), and busy time by part of the step (attention, each
  mixer, MLP / MoE, lm_head, sampler: the named scopes the model sets, read from the HLO metadata
  of each kernel's instruction); jax.profiler trace parsed with `jax.profiler.ProfileData`;
* HLO: instructions of the compiled decode step by opcode, custom-call targets, command buffers.

    python -m benchmarks.engine profile_step --size tiny --batches 4 --variants default  # CPU
    python -m benchmarks.engine profile_step                                             # GPU
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import tempfile
import time

from benchmarks.engine.hlo import hlo_stats, instruction_parts
from benchmarks.engine.profile_report import print_table
from benchmarks.engine.runner_timing import device_inputs, time_runner
from benchmarks.engine.variants import VARIANTS, child_env
from benchmarks.harness.suite import bench_command
from benchmarks.harness.trace import (
    host_events,
    load_trace,
    profile_events,
    summarize_host,
    summarize_profile,
)


def run_variant(size: str, batches: list[int], steps: int, out: str, name: str) -> list[dict]:
    import jax
    import numpy as np

    from benchmarks.harness.models import build_model
    from benchmarks.harness.serving import make_engine

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
        compiled = runner._compiled[runner._variant(bucket, [batch_in], drafts=True)]
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


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", default="1b", help="a bench model size (harness/models.py)")
    parser.add_argument("--batches", default="1,64")
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--variants", default=",".join(VARIANTS))
    parser.add_argument("--child", default=None)
    args = parser.parse_args(argv)
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
        flags = ["--size", args.size, "--batches", args.batches, "--steps", str(args.steps)]
        cmd = bench_command("benchmarks.engine", "profile_step", *flags, "--child", name)
        print(f"== {name}: {VARIANTS[name]}", flush=True)
        if "TF_CPP_VMODULE" in VARIANTS[name]:  # the log goes to a file of its own
            with open(os.path.join(out, f"vlog_{name}.txt"), "w") as log:
                subprocess.run(cmd, env=env, check=False, stderr=log)
        else:
            subprocess.run(cmd, env=env, check=False)
    print_table(out, args.variants.split(","))
