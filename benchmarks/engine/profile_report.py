"""The tables the `profile_step` bench prints from its variants' result files: step timings, GPU
busy time by part of the step, and host events per step."""

from __future__ import annotations

import json
import os

from benchmarks.engine.hlo import top_level


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
