"""A benchmark's numbers from its records: time to first token, time per output token (after the
first), end-to-end latency (mean, p50, p99, in milliseconds), requests and tokens per second over
the run's wall time."""

from __future__ import annotations

import numpy as np

from runtime.bench.targets import Record


def summary(records: list[Record], wall_seconds: float) -> dict[str, float]:
    """The run's numbers (see the module docstring)."""
    ttft = np.array([r.ttft for r in records]) * 1e3
    latency = np.array([r.latency for r in records]) * 1e3
    tpot = np.array(
        [(r.latency - r.ttft) / (r.output_tokens - 1) * 1e3 for r in records if r.output_tokens > 1]
    )
    out = sum(r.output_tokens for r in records)
    result = {
        "requests": float(len(records)),
        "wall_s": wall_seconds,
        "request_per_s": len(records) / wall_seconds,
        "output_tokens_per_s": out / wall_seconds,
        "total_tokens_per_s": (out + sum(r.prompt_tokens for r in records)) / wall_seconds,
        "prompt_tokens_mean": float(np.mean([r.prompt_tokens for r in records])),
        "output_tokens_mean": float(np.mean([r.output_tokens for r in records])),
    }
    for name, values in (("ttft_ms", ttft), ("tpot_ms", tpot), ("latency_ms", latency)):
        for stat, value in _stats(values).items():
            result[f"{name}_{stat}"] = value
    return result


def _stats(values: np.ndarray) -> dict[str, float]:
    if values.size == 0:
        return {"mean": float("nan"), "p50": float("nan"), "p99": float("nan")}
    return {
        "mean": float(values.mean()),
        "p50": float(np.percentile(values, 50)),
        "p99": float(np.percentile(values, 99)),
    }


def table(result: dict[str, float]) -> str:
    """The numbers as a small text table."""
    lines = [
        f"requests: {result['requests']:.0f} in {result['wall_s']:.2f} s = "
        f"{result['request_per_s']:.2f} req/s; tokens/s: {result['output_tokens_per_s']:.1f} "
        f"out, {result['total_tokens_per_s']:.1f} in + out; mean tokens: "
        f"{result['prompt_tokens_mean']:.0f} in, {result['output_tokens_mean']:.0f} out",
        f"{'':>12} {'mean':>10} {'p50':>10} {'p99':>10}",
    ]
    for name, label in (
        ("ttft_ms", "TTFT ms"),
        ("tpot_ms", "TPOT ms"),
        ("latency_ms", "latency ms"),
    ):
        row = [result[f"{name}_{stat}"] for stat in ("mean", "p50", "p99")]
        lines.append(f"{label:>12} " + " ".join(f"{value:10.2f}" for value in row))
    return "\n".join(lines)
