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
import collections
import glob
import json
import os
import re
import subprocess
import sys
import tempfile
import time

# name -> environment of the child process (XLA_FLAGS are appended to the caller's).
VARIANTS: dict[str, dict[str, str]] = {
    "default": {},
    "no_cmdbuf": {"XLA_FLAGS": "--xla_gpu_enable_command_buffer="},
    "cmdbuf_all": {
        "XLA_FLAGS": "--xla_gpu_enable_command_buffer=FUSION,CUBLAS,CUBLASLT,"
        "CUSTOM_CALL,CUDNN,CONDITIONAL,WHILE --xla_gpu_graph_min_graph_size=1"
    },
    # XLA turns its command buffers off while a profile is taken unless told otherwise: with this
    # flag the profile shows the step as it runs (fewer launches, shorter gaps) when graphs apply.
    "cmdbuf_prof": {"XLA_FLAGS": "--xla_enable_command_buffers_during_profiling=true"},
    # benchmarks/probe_launch.py: XLA's default minimum graph size left chains of fusions between
    # other kernels launched one by one (7.6 us a kernel); a minimum of 1 took 1.0 us.
    "min_graph1": {"XLA_FLAGS": "--xla_gpu_graph_min_graph_size=1"},
    # At batch 1 XLA rewrites each [1, K] x [K, N] matmul into a multiply + reduce fusion (35-45%
    # of bandwidth on the H100); a threshold of 0 may keep them GEMMs.
    "gemm_threshold0": {"XLA_FLAGS": "--xla_gpu_gemm_rewrite_size_threshold=0"},
    # The whole step is one command buffer, but the host trace showed it re-recorded
    # (`command_buffer::update`) on every call: some buffer's address moved. These try to keep
    # the addresses the graph sees still: a virtual-memory allocator, or copying moved buffers
    # into cached ones. (XLA's VA remapping flag aborted the process on the H100's jaxlib.)
    "vmm": {"XLA_PYTHON_CLIENT_ALLOCATOR": "vmm"},
    "cached_allocs": {"XLA_COMMAND_BUFFERS_USE_CACHED_ALLOCS": "1"},
    # The recorded graph's launch (cuGraphLaunch) takes 0.4-0.6 ms of host at B = 1 against 70 us
    # for a chain of as many kernels: what the step's graph has that the chain has not. Its
    # shape (XLA orders the commands as a DAG by default; SERIALIZE makes a chain), cuBLAS
    # calls recorded inside it (kept out of the graphs here), PDL between kernels.
    "sched_serialize": {"XLA_FLAGS": "--xla_gpu_command_buffer_scheduling_mode=SERIALIZE"},
    "sched_concurrent": {"XLA_FLAGS": "--xla_gpu_command_buffer_scheduling_mode=CONCURRENT"},
    "sched_regions": {"XLA_FLAGS": "--xla_gpu_command_buffer_scheduling_mode=CONCURRENT_REGIONS"},
    "no_cublas_graph": {"XLA_FLAGS": "--xla_gpu_enable_command_buffer=FUSION,CUSTOM_CALL"},
    "pdl": {"XLA_FLAGS": "--xla_gpu_enable_pdl=true"},
    # The command buffer's own log: which allocations changed before each update.
    "cmdbuf_vlog": {
        "TF_CPP_MIN_LOG_LEVEL": "0",
        "TF_CPP_VMODULE": "command_buffer_thunk=3,gpu_executable=3",
    },
}


def child_env(name: str, out: str) -> dict[str, str]:
    """The environment of variant `name`'s child process."""
    variant = VARIANTS[name]
    flags = f"{os.environ.get('XLA_FLAGS', '')} {variant.get('XLA_FLAGS', '')}".strip()
    return {**os.environ, **variant, "OUT": out, "XLA_FLAGS": flags}


def hlo_stats(text: str) -> dict:
    """Opcode counts of the ENTRY computation, custom-call targets, command-buffer mentions."""
    entry = text[text.index("ENTRY") :]
    entry = entry[: entry.index("\n}\n")] if "\n}\n" in entry else entry
    ops = collections.Counter(re.findall(r"= \S+ (\S+?)\(", entry))
    targets = collections.Counter(re.findall(r'custom_call_target="([^"]+)"', text))
    return {
        "entry_ops": dict(ops.most_common()),
        "entry_total": sum(ops.values()),
        "custom_call_targets": dict(targets),
        "fusions_total": len(re.findall(r"\bfusion\(", text)),
        "command_buffer_mentions": len(re.findall(r"command_buffer", text)),
    }


def load_trace(trace_dir: str):
    """The `jax.profiler.ProfileData` of the one trace written under `trace_dir`."""
    import jax

    (path,) = glob.glob(os.path.join(trace_dir, "**", "*.xplane.pb"), recursive=True)
    return jax.profiler.ProfileData.from_file(path)


def profile_events(data) -> list[tuple[str, str, int, int, str]]:
    """(line name, event name, start ns, duration ns, HLO op or "") of every GPU-plane event of
    a trace (`load_trace`)."""
    events = []
    for plane in data.planes:
        if not plane.name.startswith("/device:GPU"):
            continue
        for line in plane.lines:
            for event in line.events:
                stats = dict(event.stats)
                events.append(
                    (
                        line.name,
                        event.name,
                        event.start_ns,
                        event.duration_ns,
                        str(stats.get("hlo_op", "")),
                    )
                )
    return events


def host_events(data) -> list[tuple[str, str, int]]:
    """(thread, event name with numbers and #metadata# masked, duration ns) of every host-plane
    event of a trace: where the host spends a step's call (argument handling, thunks, graph
    launches)."""
    events = []
    for plane in data.planes:
        if not plane.name.startswith("/host:"):
            continue
        for line in plane.lines:
            for event in line.events:
                name = re.sub(r"\d+", "N", re.sub(r"#.*", "", event.name))[:80]
                events.append((line.name, name, event.duration_ns))
    return events


def summarize_host(events: list, steps: int, top: int = 40) -> list[tuple[str, str, float, float]]:
    """The `top` (thread, event) pairs by total time: (thread, event, calls per step, us per
    step). Events nest, so totals overlap: read them as a tree of where the call's time goes."""
    totals = collections.defaultdict(lambda: [0, 0])
    for thread, name, dur in events:
        totals[(thread, name)][0] += 1
        totals[(thread, name)][1] += dur
    ranked = sorted(totals.items(), key=lambda kv: -kv[1][1])[:top]
    return [(t, n, c / steps, d / steps / 1e3) for (t, n), (c, d) in ranked]


def instruction_parts(hlo_text: str) -> dict[str, str]:
    """HLO instruction name (and Pallas kernel name) -> the part of the step it belongs to: the
    named scope in its op_name metadata (`mixer_<Mixer>`, `ffn_<Ffn>`, `lm_head`, `sampler`, set
    by jmamba.model and runtime.device.model_runner), else "other" (embedding, input unpacking)."""
    parts = {}
    for match in re.finditer(
        r'^\s*(?:ROOT )?%?([\w.\-]+) = [^\n]*?op_name="([^"]+)"', hlo_text, re.M
    ):
        op_name = match.group(2)
        scope = re.search(r"(mixer_\w+?|ffn_\w+?|lm_head|sampler)(?:/|$)", op_name)
        part = scope.group(1) if scope else "other"
        parts[match.group(1)] = part
        kernel = re.search(r"/(\w+)/pallas_call$", op_name)  # a Pallas kernel keeps its name
        if kernel:
            parts[kernel.group(1)] = part
    return parts


def _is_stream(line: str) -> bool:
    return "Stream" in line or "stream" in line


def summarize_profile(events: list, steps: int, parts: dict[str, str] | None = None) -> dict:
    """Per line: events, busy and span ms per step; the top kernels; GPU busy ms per step by part
    (kernels matched to HLO instructions by their `hlo_op` stat, else by name, else the part of
    the kernel before them)."""
    by_line = collections.defaultdict(list)
    for line, name, start, dur, _ in events:
        by_line[line].append((name, start, dur))
    lines = {}
    for line, evs in by_line.items():
        span = max(s + d for _, s, d in evs) - min(s for _, s, d in evs)
        lines[line] = {
            "events_per_step": len(evs) / steps,
            "busy_ms_per_step": sum(d for *_, d in evs) / steps / 1e6,
            "span_ms_per_step": span / steps / 1e6,
        }
    kernels = collections.defaultdict(lambda: [0, 0])
    by_part = collections.defaultdict(lambda: [0, 0.0])
    parts = parts or {}
    normalised = {k.replace(".", "_").replace("-", "_"): v for k, v in parts.items()}
    previous = "unattributed"
    for line, name, _, dur, hlo_op in sorted(events, key=lambda e: (e[0], e[2])):
        if not _is_stream(line):
            continue
        kernels[name][0] += 1
        kernels[name][1] += dur
        # cuBLAS kernels and copies carry no instruction name: they take the part of the kernel
        # launched before them on the stream (a GEMM follows the norm or glue of its own layer).
        part = parts.get(hlo_op) or normalised.get(name.replace(".", "_")) or previous
        previous = part
        by_part[part][0] += 1
        by_part[part][1] += dur
    top = sorted(kernels.items(), key=lambda kv: -kv[1][1])[:30]
    ranked = sorted(by_part.items(), key=lambda kv: -kv[1][1])
    return {
        "lines": lines,
        "top_kernels": [(n, c / steps, t / steps / 1e3) for n, (c, t) in top],
        "parts": {
            p: {"kernels_per_step": c / steps, "busy_ms_per_step": t / steps / 1e6}
            for p, (c, t) in ranked
        },
    }


def run_variant(size: str, batches: list[int], steps: int, out: str, name: str) -> list[dict]:
    import jax
    import numpy as np

    sys.path.insert(0, os.path.dirname(__file__))
    from bench_engine import build_model, make_engine

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
        compiled = runner._compiled[(bucket, batch_in.mode, False)]
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


def device_inputs(runner, bucket, batch_in, jax):
    """The step's packed inputs, already on the device."""
    return runner.device_inputs(bucket, [batch_in])


def time_runner(runner, bucket, batch_in, steps, np, jax) -> dict:
    """ms per call: numpy inputs + fetch; device inputs + fetch; pipelined; dispatch only."""
    res = {}
    t0 = time.perf_counter()
    for _ in range(steps):
        runner.run(bucket, [batch_in])
    res["runner_numpy_ms"] = 1e3 * (time.perf_counter() - t0) / steps
    dev = device_inputs(runner, bucket, batch_in, jax)
    t0 = time.perf_counter()
    for _ in range(steps):
        np.asarray(runner.dispatch(bucket, [batch_in], dev).tokens)
    res["runner_device_in_ms"] = 1e3 * (time.perf_counter() - t0) / steps
    t0 = time.perf_counter()
    for _ in range(steps):
        step = runner.dispatch(bucket, [batch_in], dev)
    np.asarray(step.tokens)
    res["pipelined_ms"] = 1e3 * (time.perf_counter() - t0) / steps
    dispatch = 0.0
    for _ in range(steps):
        t0 = time.perf_counter()
        step = runner.dispatch(bucket, [batch_in], dev)
        dispatch += time.perf_counter() - t0
        np.asarray(step.tokens)
    res["dispatch_ms"] = 1e3 * dispatch / steps
    t0 = time.perf_counter()
    for _ in range(steps):
        dev_np = jax.device_put((batch_in.inputs, batch_in.sampling))
    jax.block_until_ready(dev_np)
    res["device_put_tree_ms"] = 1e3 * (time.perf_counter() - t0) / steps
    t0 = time.perf_counter()
    for _ in range(steps):
        dev_np = device_inputs(runner, bucket, batch_in, jax)
    jax.block_until_ready(dev_np)
    res["device_put_packed_ms"] = 1e3 * (time.perf_counter() - t0) / steps
    key = runner._variant(bucket, [batch_in], carry=False)
    res.update(time_step_call(runner, key, dev, steps, jax))
    return res


def time_step_call(runner, key, packed, steps: int, jax) -> dict:
    """ms until the compiled step alone returns (no upload, download or fetch), in one process:
    `stable`, with the variant's own output buffers, so every buffer keeps its address; `fresh`,
    with new output buffers each call (the runner before runtime/device/step_buffers.py), so XLA
    records the step's CUDA graph again before each launch. Each in a block of its own (the first
    call of a block, which re-records after the other, is left out)."""
    import jax.numpy as jnp

    compiled, slot = runner._compiled[key], runner.buffers.upload(key, packed)
    carried = runner.buffers.carried if key.carry else None

    def call(outputs):
        t0 = time.perf_counter()
        runner.caches, outputs, _ = compiled(
            runner._param_leaves, runner.caches, slot, outputs, carried
        )
        elapsed = time.perf_counter() - t0
        jax.block_until_ready(outputs)
        return elapsed, outputs

    res, outputs, alive = {}, runner.buffers.outputs(key), []
    for name in ("stable", "fresh"):
        total = 0.0
        for i in range(steps + 1):
            if name == "fresh":  # new buffers while the last ones are alive: a new address
                outputs = jax.block_until_ready(jax.tree.map(jnp.zeros_like, outputs))
            elapsed, outputs = call(outputs)
            alive = [outputs, *alive[:1]]
            total += elapsed if i else 0.0
        res[f"call_{name}_ms"] = 1e3 * total / steps
    runner.buffers.keep(key, outputs, None)
    return res


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


def top_level(hlo: dict) -> str:
    """Command buffers, custom calls and fusions left in the ENTRY computation: a kernel outside
    every command buffer is launched by the host one by one."""
    ops = hlo["entry_ops"]
    return f"{ops.get('call', 0)} / {ops.get('custom-call', 0)} / {ops.get('fusion', 0)}"


def print_table(out: str, names: list[str]) -> None:
    results = {}  # variant -> its rows, each results file read once
    for name in names:
        path = os.path.join(out, f"profile_{name}.json")
        if os.path.exists(path):
            with open(path) as f:
                results[name] = json.load(f)
    print(
        "variant     batch eng_step eng_host eng_dev run_np run_dev pipe  disp  put   "
        "call_stable call_fresh "
        "kern/step gpu_busy entry_ops (calls = command buffers, custom-calls, fusions at top level)"
    )
    for name in names:
        if name not in results:
            print(f"{name}: no result")
        for r in results.get(name, []):
            lines = r["profile"].get("lines", {})
            streams = [v for k, v in lines.items() if "Stream" in k or "stream" in k]
            kern = sum(v["events_per_step"] for v in streams)
            busy = sum(v["busy_ms_per_step"] for v in streams)
            print(
                f"{name:11s} {r['batch']:5d} {r['engine_step_ms']:8.3f} "
                f"{r['engine_host_ms']:8.3f} {r['engine_device_ms']:7.3f} "
                f"{r['runner_numpy_ms']:6.3f} {r['runner_device_in_ms']:7.3f} "
                f"{r['pipelined_ms']:5.3f} {r['dispatch_ms']:5.3f} "
                f"{r['device_put_packed_ms']:5.3f} "
                f"{r.get('call_stable_ms', float('nan')):11.3f} "
                f"{r.get('call_fresh_ms', float('nan')):10.3f} "
                f"{kern:9.1f} {busy:8.3f} {r['hlo']['entry_total']} "
                f"({top_level(r['hlo'])})"
            )
    print("GPU busy ms per step by part (kernels per step)")
    for name, rows in results.items():
        for r in rows:
            parts = r["profile"].get("parts", {})
            cells = [
                f"{p} {v['busy_ms_per_step']:.3f} ({v['kernels_per_step']:.0f})"
                for p, v in parts.items()
            ]
            print(f"{name:11s} {r['batch']:5d}  " + ", ".join(cells))
    print("Host events per step (thread, event, calls, us), nested")
    for name, rows in results.items():
        for r in rows:
            for thread, event, calls, us in r["profile"].get("host", []):
                print(
                    f"{name:11s} {r['batch']:5d}  {thread[:24]:24s} {event:60s} "
                    f"{calls:7.1f} {us:9.1f}"
                )


if __name__ == "__main__":
    main()
