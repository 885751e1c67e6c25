"""`python -m benchmarks.serving prefix_cache` on CPU with the tiny model and small counts (~15 s):
every mode and workload runs, nothing compiles while timed, the JSON is written, and the hit rates
are what the workloads allow."""

from __future__ import annotations

import json

from benchmarks.serving import prefix_cache

SMOKE = [
    "--size",
    "tiny",
    "--requests",
    "4",
    "--prefix-len",
    "64",
    "--own-len",
    "16",
    "--output-len",
    "4",
    "--conversations",
    "2",
    "--turns",
    "2",
    "--first-len",
    "32",
    "--question-len",
    "16",
    "--max-num-seqs",
    "4",
    "--budget",
    "64",
    "--max-cached-states",
    "16",
]


def test_smoke_run_reports_every_mode_and_workload(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("OUT", str(tmp_path))
    rows = prefix_cache.main(SMOKE)
    assert [(r["workload"], r["mode"]) for r in rows] == [
        (w, m) for m in ("off", "align", "all") for w in ("shared", "chat")
    ]
    assert json.loads((tmp_path / "bench_prefix_cache.json").read_text())["rows"] == rows
    assert "ttft_mean_s" in capsys.readouterr().out
    for r in rows:
        assert r["compiled_while_timed"] == 0 and r["output_tokens"] == 4 * r["requests"]
        assert 0 < r["ttft_mean_s"] <= r["ttft_p99_s"] and r["steps"] > 0
    by = {(r["workload"], r["mode"]): r for r in rows}
    assert by["shared", "off"]["hit_rate"] == 0 and by["shared", "off"]["cache"] is None
    # 64 shared tokens = 4 state blocks of 16, prompts of 80: the first step is the first
    # request's 64-token chunk alone (the budget), so the prefix is published before any other
    # request is admitted; the other 3 skip exactly 64 tokens (79 // 16 * 16 = 64).
    for mode in ("align", "all"):
        assert by["shared", mode]["hit_rate"] == 3 * 64 / (4 * 80), by["shared", mode]
        # turn 2 = 32 + 4 answer + 16 question tokens: it hits the state at 32 at least
        assert by["chat", mode]["hit_rate_turns_2_plus"] >= 32 / 52
