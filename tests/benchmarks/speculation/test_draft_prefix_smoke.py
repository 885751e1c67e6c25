"""`python -m benchmarks.speculation draft_prefix` on CPU with the tiny models: each prompt's second
serve hits, the drafting engine runs fill passes for it, and the rows land in the JSON."""

from __future__ import annotations

import json

from benchmarks.speculation import draft_prefix


def test_tiny_run_times_the_fill_passes_of_each_hit(tmp_path):
    out = tmp_path / "rows.json"
    argv = ["--size", "tiny", "--lengths", "40,72", "--max-tokens", "3", "--budget", "64"]
    rows = draft_prefix.main([*argv, "--json", str(out)])
    assert [r["prompt"] for r in rows] == [40, 72]
    for r in rows:
        assert r["fill_ms"] > 0 and r["plain_hit_ms"] > 0 and r["draft_hit_ms"] > 0
    assert rows[-1]["cached_tokens"] > 0
    assert json.loads(out.read_text()) == rows
