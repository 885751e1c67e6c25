"""Every suite's one entry, `python -m benchmarks.<suite> BENCH [flags]`: its `--help` lists each
of its benches, every bench it names is a module of the suite with a `main(argv)`, and a module
of the suite that has a `main` is one of its benches; an unknown bench is refused. The GPU checks
also answer at the path the project's rules name, benchmarks/gpu_checks.py, from any directory."""

from __future__ import annotations

import ast
import importlib
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks.harness.suite import REPO_ROOT, run_suite

SUITES = ("kernels", "engine", "serving", "speculation", "parallel", "checks")


def benches(suite: str) -> tuple[str, ...]:
    return importlib.import_module(f"benchmarks.{suite}.__main__").BENCHES


def defines_main(path: Path) -> bool:
    tree = ast.parse(path.read_text())
    return any(isinstance(node, ast.FunctionDef) and node.name == "main" for node in tree.body)


@pytest.mark.parametrize("suite", SUITES)
def test_help_lists_every_bench_and_every_bench_has_a_main(suite):
    done = subprocess.run(
        [sys.executable, "-m", f"benchmarks.{suite}", "--help"],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    listed = [line.split()[0] for line in done.stdout.split("benches:\n")[1].splitlines()[:-2]]
    folder = REPO_ROOT / "benchmarks" / suite
    with_main = {p.stem for p in folder.glob("*.py") if p.stem != "__main__" and defines_main(p)}
    assert set(benches(suite)) == with_main
    assert set(benches(suite)) <= set(listed)


def test_an_unknown_bench_is_refused(capsys):
    assert run_suite("benchmarks.engine", benches("engine"), ["nope"]) == 2
    assert (
        "no bench 'nope'; its benches: decode, multi_step, profile_step, profile_host, "
        "sampler_modes, compile_time" in capsys.readouterr().err
    )


def test_gpu_checks_answer_at_their_path_from_any_directory(tmp_path):
    script = REPO_ROOT / "benchmarks" / "gpu_checks.py"
    done = subprocess.run(
        [sys.executable, str(script), "--help"], cwd=tmp_path, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    assert "--only" in done.stdout and "--jobs" in done.stdout
