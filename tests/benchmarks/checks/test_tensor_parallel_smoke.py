"""The GPU checks' `tp` section on fake CPU devices (the test run has four): a fixture served on
one device and split over two gives the same tokens and logits, and a mesh larger than the
devices fails its check instead of running."""

from __future__ import annotations

from benchmarks.checks import gpu, tensor_parallel


def test_mamba2_split_over_two_devices_passes(monkeypatch, capsys):
    monkeypatch.setenv(tensor_parallel.MESH_ENV, "")  # main sets it; restored afterwards
    assert gpu.main(["--only", "tp", "--tp", "2", "--families", "mamba2"]) == 0
    assert "ok   tp mamba2 dp=1 tp=2 tokens equal" in capsys.readouterr().out


def test_a_mesh_larger_than_the_devices_fails(monkeypatch, capsys):
    monkeypatch.setenv(tensor_parallel.MESH_ENV, "")
    assert gpu.main(["--only", "tp", "--tp", "8"]) == 1
    assert "needs 8 devices" in capsys.readouterr().out
