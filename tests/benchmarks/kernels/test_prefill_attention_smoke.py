"""`python -m benchmarks.kernels prefill_attention` on CPU (interpret mode, one short prompt): the
kernel is checked against the reference, timed with a tuning beside its defaults, and the rows land
in $OUT."""

from __future__ import annotations

import json

from benchmarks.kernels import prefill_attention


def test_short_prompt_row(monkeypatch, tmp_path):
    monkeypatch.setenv("OUT", str(tmp_path))
    argv = ["--shapes", "qwen3next", "--lengths", "40", "--calls", "1", "--tunings", "16:32:4:2"]
    (row,) = prefill_attention.main(argv)
    assert row["rel_err"] < 1e-2  # bf16 operands against the fp32 reference
    assert row["ours_us"] > 0 and set(row["tunings_us"]) == {"16:32:4:2"}
    assert json.loads((tmp_path / "bench_prefill_attention.json").read_text()) == [row]
