"""The kernel section of benchmarks/gpu_checks.py runs on CPU (interpret mode) and passes."""

from __future__ import annotations

from benchmarks import gpu_checks


def test_kernel_section_quick_passes(monkeypatch):
    monkeypatch.setenv("JMAMBA_CHECK_SEED", "0")  # CI repeats one draw; the GPU run draws afresh
    assert gpu_checks.main(["--quick", "--only", "kernels"]) == 0
