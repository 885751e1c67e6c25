"""`python -m benchmarks.kernels fp8_linear` on CPU (XLA's e4m3 dot, the weight-only kernel
interpreted): every form is reported, each product's error is its output's rounding (FP8-sized
for the quantized activations), the kernel rounds row 0 the same at every M, the sweep runs, and
the JSON lands in $OUT."""

from __future__ import annotations

import json

from benchmarks.kernels import fp8_linear, matmul


def test_tiny_run_reports_times_errors_and_rounding(monkeypatch, tmp_path):
    monkeypatch.setenv("OUT", str(tmp_path))
    monkeypatch.setattr(fp8_linear, "SWEEP", {"m32": dict(block_m=32)})
    for name, value in (("PER_PROGRAM", 1), ("QUEUED", 2), ("RUNS", 1)):  # interpreted: few runs
        monkeypatch.setattr(matmul, name, value)
    argv = ["--ms", "1,19", "--shapes", "200x136", "--tunings", "sweep", "--sweep-ms", "3"]
    result = fp8_linear.main(argv)
    assert [(r["k"], r["n"], r["m"]) for r in result["rows"]] == [(200, 136, 1), (200, 136, 19)]
    assert result["forms"] == fp8_linear.FORMS  # every form by default
    for row in result["rows"]:
        assert row["bf16_us"] > 0 and row["bf16_err"] < 0.02 and row["bf16_roofline"] > 0
        for form in result["forms"]:
            assert row[f"{form}_us"] > 0 and row[f"{form}_roofline"] > 0, form
            assert 0 < row[f"{form}_qerr"] < 0.1, form
        for form in ("wo_ch", "wo_blk", "xla_ch", "xla_blk"):  # bf16 rows: one output rounding
            assert row[f"{form}_err"] < 0.01, form
        assert row["w8a8_ch_err"] < 0.1 and row["w8a8_blk_err"] < 0.1
    assert result["rows"][1]["wo_differ"] == 0
    assert all(r["differ"] == 0 for r in result["sweep"])  # interpreted: the same dots
    assert [(r["m"], r["block"], r["tuning"]) for r in result["sweep"]] == [
        (3, "ch", "m32"),
        (3, "blk", "m32"),
    ]
    saved = json.loads((tmp_path / "bench_fp8_linear.json").read_text())
    assert saved["rows"] == json.loads(json.dumps(result["rows"]))


def test_forms_pick_the_columns(monkeypatch):
    """`--forms` times the named FP8 forms only (a GPU call's time is mostly their compiles)."""
    for name, value in (("PER_PROGRAM", 1), ("QUEUED", 1), ("RUNS", 1)):
        monkeypatch.setattr(matmul, name, value)
    result = fp8_linear.main(["--ms", "2", "--shapes", "64x48", "--forms", "xla_ch"])
    (row,) = result["rows"]
    assert "xla_ch_us" in row and "wo_ch_us" not in row and "wo_differ" not in row
