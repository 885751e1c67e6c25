"""`python -m benchmarks.engine profile_step` on CPU: one variant's child process times the engine
and the runner, traces the compiled decode step and reads its HLO. (Its lookup of the compiled step
broke when the runner's variants gained a key type and nothing ran it until a GPU call.)"""

from __future__ import annotations

import json
import os
import subprocess
import sys

from benchmarks.harness.suite import REPO_ROOT


def test_tiny_child_reports_timings_profile_and_hlo(tmp_path):
    env = os.environ | {"OUT": str(tmp_path), "PYTHONPATH": str(REPO_ROOT)}
    command = [sys.executable, "-m", "benchmarks.engine", "profile_step", "--size", "tiny"]
    command += ["--batches", "4", "--steps", "3", "--child", "default"]
    done = subprocess.run(
        command, cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-3000:]
    (row,) = json.loads((tmp_path / "profile_default.json").read_text())
    assert row["batch"] == 4 and row["engine_step_ms"] > 0 and row["runner_device_in_ms"] > 0
    assert set(row["profile"]) == {"lines", "top_kernels", "parts", "host"}  # no "error"
    assert row["profile"]["host"] and row["hlo"]["entry_total"] > 0
    assert (tmp_path / "hlo_default_b4.txt").exists()
