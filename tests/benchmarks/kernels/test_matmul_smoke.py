"""`python -m benchmarks.kernels matmul` on CPU (the kernel interpreted): every column is reported,
our product rounds row 0 the same at every M, the sweep runs, and the JSON lands in $OUT."""

from __future__ import annotations

import json

from benchmarks.kernels import matmul


def test_tiny_run_reports_times_and_rounding(monkeypatch, tmp_path):
    monkeypatch.setenv("OUT", str(tmp_path))
    monkeypatch.setenv("JMAMBA_KERNELS", "interpret")
    monkeypatch.setattr(matmul, "SWEEP", {"m32": dict(block_m=32)})
    argv = ["--ms", "1,19", "--shapes", "200x45", "--tunings", "sweep", "--sweep-ms", "3"]
    result = matmul.main(argv)
    assert [(r["shape"], r["m"]) for r in result["rows"]] == [("200x45", 1), ("200x45", 19)]
    for row in result["rows"]:
        assert row["ours_us"] > 0 and row["xla_us"] > 0 and row["ours_differ"] == 0
    assert [(r["m"], r["tuning"]) for r in result["sweep"]] == [(3, "m32")]
    saved = json.loads((tmp_path / "bench_matmul.json").read_text())
    assert saved["rows"] == json.loads(json.dumps(result["rows"]))
