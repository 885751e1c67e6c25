"""`python -m benchmarks.kernels fp8_linear` on CPU (XLA's e4m3 dot): every column is reported,
the FP8 products' errors are FP8-sized, and the JSON lands in $OUT."""

from __future__ import annotations

import json

from benchmarks.kernels import fp8_linear


def test_tiny_run_reports_times_and_errors(monkeypatch, tmp_path):
    monkeypatch.setenv("OUT", str(tmp_path))
    result = fp8_linear.main(["--ms", "1,19", "--shapes", "200x136"])
    assert [(r["k"], r["n"], r["m"]) for r in result["rows"]] == [(200, 136, 1), (200, 136, 19)]
    for row in result["rows"]:
        assert row["bf16_us"] > 0 and row["fp8_ch_us"] > 0 and row["fp8_blk_us"] > 0
        assert row["bf16_err"] < 0.02
        assert 0 < row["fp8_ch_err"] < 0.1 and 0 < row["fp8_blk_err"] < 0.1
        assert row["fp8_ch_err_vs_dequant"] < 0.1
    saved = json.loads((tmp_path / "bench_fp8_linear.json").read_text())
    assert saved["rows"] == json.loads(json.dumps(result["rows"]))
