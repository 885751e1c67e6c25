"""`python -m benchmarks.engine compile_time` on CPU: a setting's child process compiles the
serving warm-up's programs from nothing and times decode steps on them."""

from __future__ import annotations

from benchmarks.engine import compile_time
from benchmarks.harness import timing


def test_a_setting_compiles_every_warm_up_program_and_times_decode(monkeypatch):
    monkeypatch.setattr(timing, "RESULTS", [])
    compile_time.main(["--size", "tiny", "--settings", "w2", "--steps", "2", "--max-num-seqs", "4"])
    (row,) = timing.RESULTS
    assert row["setting"] == "w2" and row["programs"] >= 3
    assert 0 < row["program_s_min"] <= row["program_s_max"] <= row["program_s_sum"]
    assert row["warmup_s"] > 0 and row["decode_ms_b16"] > 0
