"""`python -m benchmarks.engine multi_step` on CPU with the tiny model: a row per way of running
the decodes (synchronous, asynchronous, N steps a program), each with its roofline, the programs
of N steps compiled and counted apart, and the JSON in $OUT."""

from __future__ import annotations

import json

from benchmarks.engine import multi_step


def test_tiny_run_reports_each_way_against_the_roofline(monkeypatch, tmp_path):
    monkeypatch.setenv("OUT", str(tmp_path))
    result = multi_step.main(["--size", "tiny", "--batches", "2", "--decode-steps", "3"])
    rows = result["rows"]
    assert [(r["async_scheduling"], r["decode_steps"]) for r in rows] == [
        (False, 1),
        (True, 1),
        (True, 3),
    ]
    assert all(r["step_ms"] > 0 and r["roofline_ms"] > 0 for r in rows)
    assert rows[2]["compile_s"] > 0  # its programs, compiled at warm-up, timed apart
    assert all(r["same_tokens"] for r in rows)  # fp32 on the CPU: the same greedy tokens
    assert json.loads((tmp_path / "multi_step_tiny.json").read_text()) == result
