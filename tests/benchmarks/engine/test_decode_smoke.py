"""`python -m benchmarks.engine decode` on CPU with the tiny model, its weights drawn on the device
as the Qwen3-Next shape's are (`--weights drawn`): a decode row and a long-context row, each with
its roofline, and the JSON in $OUT."""

from __future__ import annotations

import json

from benchmarks.engine import decode


def test_tiny_run_with_drawn_weights_reports_steps_and_rooflines(monkeypatch, tmp_path):
    monkeypatch.setenv("OUT", str(tmp_path))
    argv = ["--size", "tiny", "--batches", "2", "--steps", "3", "--contexts", "32"]
    result = decode.main([*argv, "--weights", "drawn"])
    (row,) = result["rows"]
    assert row["batch"] == 2 and row["step_ms"] > 0 and row["async_step_ms"] > 0
    assert row["roofline_ms"] > 0 and row["bytes"]["weights"] > 0 and row["bytes"]["state"] > 0
    (long_row,) = result["long_context"]
    assert long_row["context"] == 32 and long_row["bytes"]["kv"] > row["bytes"]["kv"]
    assert json.loads((tmp_path / "bench_engine_tiny.json").read_text()) == result
