"""`python -m benchmarks.parallel disaggregation` at tiny size on the CPU: a prefill process and a
decode process (one fake CPU device each) serve a shared-prefix workload over the local
transport, the baseline (one engine doing both) serves it too, every request generates all its
tokens in both with the same greedy tokens, the report names TTFT, TPOT and the hand-over's
bytes and times, and the JSON lands in $OUT. No timing is asserted."""

from __future__ import annotations

import importlib.util
import json

import pytest

from benchmarks.parallel import disaggregation
from tests.tiers import slow

ARGV = [
    *("--model", "tiny", "--requests", "3", "--prefix-len", "32", "--tail-len", "8"),
    *("--max-tokens", "4", "--concurrency", "4", "--budget", "128"),
]


@slow
def test_tiny_run_hands_over_every_request_and_matches_one_instance(monkeypatch, tmp_path, capsys):
    monkeypatch.setenv("OUT", str(tmp_path))
    monkeypatch.setenv("JAX_PLATFORMS", "cpu")
    result = disaggregation.main(ARGV)
    assert [(s["role"], s["devices"]) for s in result["sides"]] == [("prefill", 1), ("decode", 1)]
    one, pd = result["rows"]
    assert result["token_mismatches"] == 0 and pd["failed"] == 0
    assert one["generated"] == pd["generated"] == 3 * 4
    for row in (one, pd):
        assert row["requests"] == 3 and row["seconds"] > 0 and row["warm_s"] > 0
        assert row["timed_compile_s"] == 0  # the warm run compiled every step variant
        assert None not in (*row["ttft_ms"].values(), *row["tpot_ms"].values())
    handover = pd["handover"]
    assert handover["count"] == 3 and handover["wire_bytes"] > handover["row_bytes"] > 0
    for part in ("export_ms", "send_ms", "queued_ms", "admit_ms", "whole_ms"):
        assert handover[part]["p50"] is not None
    out = capsys.readouterr().out
    assert "greedy tokens: 0 of 3 requests differ between P/D and one instance; 0 failed" in out
    assert "TTFT ms p50 / p90" in out and "hand-over:" in out
    saved = json.loads((tmp_path / "bench_disaggregation.json").read_text())
    assert saved["rows"] == result["rows"] and saved["token_mismatches"] == 0


@pytest.mark.skipif(importlib.util.find_spec("nixl") is not None, reason="NIXL imports here")
def test_nixl_without_nixl_is_refused_before_any_process_starts(capsys):
    with pytest.raises(SystemExit):
        disaggregation.main([*ARGV, "--transport", "nixl"])
    assert "--transport nixl: the nixl package does not import here" in capsys.readouterr().err
