"""The model sections of the GPU checks (benchmarks/checks/gpu.py) run on CPU (kernels interpreted),
so they cannot rot between device runs: `--quick --only fixtures,batch,bf16` must pass (one fixture
through every check, one model's batch-invariance check with 4 prompts, the tiny bf16 bench model's
bitwise one with 3)."""

from __future__ import annotations

from benchmarks.checks import gpu


def test_quick_fixture_batch_and_bf16_checks_pass(monkeypatch, tmp_path, capsys):
    # The sections set JMAMBA_KERNELS for the rest of the process; restore it for later tests.
    monkeypatch.delenv("JMAMBA_KERNELS", raising=False)
    monkeypatch.setenv("OUT", str(tmp_path))
    assert gpu.main(["--quick", "--only", "fixtures,batch,bf16"]) == 0
    out = capsys.readouterr().out
    assert "fixture mamba2_odd chunked" in out and "batch mamba2" in out
    assert "ok   bf16 batch tiny (batch_invariant)" in out
    assert (tmp_path / "gpu_checks.json").is_file()
