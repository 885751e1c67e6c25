"""Reading a jax.profiler trace: the GPU-plane events (kernels, copies) and host-plane events, and
their summaries per step (busy time per line, top kernels, busy time by part of the step)."""

from __future__ import annotations

import collections
import glob
import os
import re


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
