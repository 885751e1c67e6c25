"""benchmarks/profile_host.py on CPU: every part is timed, the parts add up to the total, and
the JSON lands in $OUT."""

from __future__ import annotations

import json

from benchmarks import profile_host


def test_tiny_run_reports_every_part(monkeypatch, tmp_path):
    monkeypatch.setenv("OUT", str(tmp_path))
    rows = profile_host.main(["--batches", "1,4", "--steps", "20"])
    assert [row["batch"] for row in rows] == [1, 4]
    for row in rows:
        parts = row["parts"]
        assert set(parts) == {
            "schedule",
            "agree",
            "snapshot",
            "build",
            "postprocess",
            "record",
            "other",
        }
        assert row["host_cpu_ms"] > 0 and all(v >= 0 for k, v in parts.items() if k != "other")
        assert abs(sum(parts.values()) - row["host_cpu_ms"]) < 1e-2
    assert json.loads((tmp_path / "profile_host.json").read_text()) == rows
