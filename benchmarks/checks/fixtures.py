"""Every transformers fixture (tests/fixtures) through the compiled kernels, against HF's outputs.

For each fixture of `fixture_runs.ALL` (the five with power-of-two dims, the five `*_odd` ones,
Falcon-H1's two with attention beside Mamba2 in every layer and muP multipliers, the four Bamba /
Granite-4.0-H ones, the two Qwen3.5 checkpoints as published, `*_vl`, and Zamba2's two with
shared transformer blocks feeding Mamba2): the full forward over
both sequences, the chunked prefill + decode logits of the fixture's chunk schedule, and the final
conv / recurrent states, each as one `Check` with its max |delta| (pass at <= 1e-4, fp32 weights;
the model's fp32 matmuls run at HIGHEST precision, so the GPU needs no looser tolerance than the
CPU). The runs are those of the CPU parity test (tests/jmamba/fixture_runs.py): three compiled step
shapes per fixture. On a CPU the kernels run in interpret mode (`quick`: one fixture).
"""

from __future__ import annotations

import time

import numpy as np

from benchmarks.checks import Check, use_kernels
from tests.jmamba import fixture_runs as runs

TOL = 1e-4
# Mamba2 alone with odd dims, about 5 s interpreted (test_parity.py interprets the hybrids)
QUICK = ("mamba2_odd",)


def _check(name: str, comparisons: list[runs.Comparison], extra_ok: bool = True) -> Check:
    worst = max(comparisons, key=lambda c: c.max_error)
    error = worst.max_error
    ok = bool(error <= TOL) and extra_ok  # NaN fails
    detail = f"max|d|={error:.1e} ({worst.name}, tol {TOL:.0e})"
    return Check(name, ok, detail if extra_ok else detail + "; padding or NULL slot touched")


def check_fixture(name: str) -> list[Check]:
    """Full forward, chunked logits and final states of one fixture, one `Check` each."""
    start = time.perf_counter()
    fx = runs.load(name)
    if runs.recurrent_layers(fx) != list(fx.expected["recurrent_layers"]):
        return [Check(f"fixture {name}", False, "recurrent layer indices differ from HF's")]
    full, padding = runs.run_full(fx)
    chunked, caches = runs.run_chunked(fx)
    states = runs.final_states(fx, caches)
    checks = [
        _check(f"fixture {name} full", full, bool(np.isfinite(padding).all())),
        _check(f"fixture {name} chunked", chunked),
        _check(f"fixture {name} states", states, runs.null_slot_untouched(fx, caches)),
    ]
    seconds = f"; {time.perf_counter() - start:.0f} s"
    return [Check(c.name, c.ok, c.detail + seconds) for c in checks]


def run(quick: bool, families: list[str] | None = None) -> list[Check]:
    """Every fixture (one when `quick`, `families` when given) through the kernels; a fixture that
    raises is one failed check, the others still run."""
    use_kernels()
    checks: list[Check] = []
    for name in families or (QUICK if quick else runs.ALL):
        try:
            checks += check_fixture(name)
        except Exception as error:  # noqa: BLE001 - report it and go on with the next fixture
            message = f"{type(error).__name__}: {error}"[:300]
            checks.append(Check(f"fixture {name}", False, message))
        print(f"   {checks[-1].name}: {checks[-1].detail}", flush=True)
    return checks
