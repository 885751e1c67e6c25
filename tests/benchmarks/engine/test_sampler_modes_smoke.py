"""`python -m benchmarks.engine sampler_modes` on CPU with a small vocabulary: one row per mode
and batch, each mode's tokens the greedy ones for a greedy batch, timings positive."""

from __future__ import annotations

from benchmarks.engine import sampler_modes
from benchmarks.harness import timing


def test_small_run_gives_a_row_per_mode_and_the_greedy_tokens(monkeypatch):
    monkeypatch.setattr(timing, "RESULTS", [])
    sampler_modes.main(["--vocab", "300", "--batches", "1,3", "--inner", "2"])
    rows = timing.RESULTS
    assert [(r["batch"], r["mode"]) for r in rows] == [
        (b, m) for b in (1, 3) for m in sampler_modes.MODES
    ]
    assert all(r["tokens_equal"] and r["us"] > 0 for r in rows)
    assert all(r["extra_us"] == 0 for r in rows if r["mode"] == "greedy")
