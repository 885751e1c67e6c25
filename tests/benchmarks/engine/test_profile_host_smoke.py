"""`python -m benchmarks.engine profile_host` on CPU: every part is timed, the parts add up to the
total, the JSON lands in $OUT, and with drafts the drafting parts run."""

from __future__ import annotations

import json

from benchmarks.engine import profile_host


def _check_parts(row: dict) -> None:
    parts = row["parts"]
    assert set(parts) == {*profile_host.PARTS, "other"}
    assert row["host_cpu_ms"] > 0 and all(v >= 0 for k, v in parts.items() if k != "other")
    assert abs(sum(parts.values()) - row["host_cpu_ms"]) < 1e-2


def test_tiny_run_reports_every_part(monkeypatch, tmp_path):
    monkeypatch.setenv("OUT", str(tmp_path))
    rows = profile_host.main(["--batches", "1,4", "--steps", "20"])
    assert [row["batch"] for row in rows] == [1, 4]
    for row in rows:
        _check_parts(row)
    assert json.loads((tmp_path / "profile_host.json").read_text()) == rows


def test_drafting_run_times_full_rows_to_the_end():
    """Every row drafts K = 2 and keeps them all (the stub accepts every draft), and no request
    finishes while timed (`profile_batch` raises if one did)."""
    (row,) = profile_host.main(["--batches", "2", "--steps", "12", "--drafts", "2"])
    _check_parts(row)
    assert row["drafts"] == 2
    assert row["parts"]["verify"] > 0 and row["parts"]["drafter"] > 0
