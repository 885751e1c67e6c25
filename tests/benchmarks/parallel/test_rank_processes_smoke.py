"""`python -m benchmarks.parallel rank_processes --size tiny` on the CPU: the bench model is
written as a checkpoint, served by one and by two rank processes, every request generates all
its tokens in both, and the JSON lands in $OUT."""

from __future__ import annotations

import json

from benchmarks.parallel import rank_processes
from tests.runtime.ranks.cache import shared_cache_env
from tests.tiers import slow


@slow
def test_tiny_run_serves_every_token_on_one_and_two_ranks(monkeypatch, tmp_path, capsys):
    monkeypatch.setenv("OUT", str(tmp_path))
    for name, value in shared_cache_env(tmp_path / "cache").items():  # DP = 2 loads DP = 1's
        monkeypatch.setenv(name, value)
    argv = ["--size", "tiny", "--requests", "6", "--prompt-len", "5", "--max-tokens", "3"]
    result = rank_processes.main([*argv, "--seqs", "4", "--budget", "32", "--repeats", "1"])
    assert [r["ranks"] for r in result["rows"]] == [1, 2]
    assert all(r["generated"] == 6 * 3 for r in result["rows"])
    assert all(steps > 0 for steps in result["rows"][1]["live_steps"])  # both ranks served
    assert "DP=2 rank processes / DP=1:" in capsys.readouterr().out
    saved = json.loads((tmp_path / "bench_rank_processes.json").read_text())
    assert saved["rows"] == result["rows"]
