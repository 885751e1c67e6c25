"""`python -m benchmarks.parallel tensor_parallel --small` on 2 fake CPU devices: the issue's two
shapes (the 20B one is the 80B's layers, fewer) decode at tp = 2 with a roofline (all-reduce bytes
over the measured link included) and a prefill row on one runner each, the markdown tables are
printed and the JSON lands in $OUT (one batch size: CI time)."""

from __future__ import annotations

import json

from benchmarks.parallel import tensor_parallel


def test_small_run_reports_both_shapes(monkeypatch, tmp_path, capsys):
    monkeypatch.setenv("OUT", str(tmp_path))
    shapes = {"qwen3next80b", "nemotronh47b"}
    argv = ["--small", "--tp", "2", "--batches", "2", "--steps", "2", "--prefill-len", "64"]
    rows, prefill = tensor_parallel.main([*argv, "--shapes", ",".join(sorted(shapes))])
    assert {(r["shape"], r["tp"], r["batch"]) for r in rows} == {(s, 2, 2) for s in shapes}
    assert {(r["shape"], r["tp"]) for r in prefill} == {(s, 2) for s in shapes}
    for r in rows:
        assert r["step_ms"] > 0 and r["roofline_ms"] > 0 and r["allreduce_mb"] > 0
    out = capsys.readouterr().out
    assert "| shape | tp | dp | B | step ms |" in out and "| weights s | decode variants |" in out
    saved = json.loads((tmp_path / "bench_tensor_parallel.json").read_text())
    assert len(saved["rows"]) == len(rows)
    assert {(r["shape"], r["variants"]) for r in saved["setup"]} == {(s, 1) for s in shapes}
