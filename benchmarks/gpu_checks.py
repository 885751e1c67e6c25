"""Every kernel and model through the compiled kernels, checked against independent references.

One run on the GPU; exits 1 if any check fails. Sections (each a module of `benchmarks/checks/`):
  kernels   every Pallas kernel against its plain-jnp reference on a grid of odd shapes
  fixtures  every transformers fixture (tests/fixtures) through the compiled kernels
  batch     a request's prefill output does not depend on the batch it shares (DESIGN section 5.8)

    PYTHONPATH=. python benchmarks/gpu_checks.py [--quick] [--only kernels,fixtures,batch]

`--quick` runs a small subset; on a CPU the kernels run in interpret mode (the CI smoke test
does this).
Results are printed as a table and, when $OUT is set, written to $OUT/gpu_checks.json.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import sys
import time

import jax

from benchmarks.checks import Check

SECTIONS = ("kernels", "fixtures", "batch")
_MODULES = {"kernels": "benchmarks.checks.kernel_grid", "fixtures": "benchmarks.checks.fixtures",
            "batch": "benchmarks.checks.batch_invariance"}  # fmt: skip


def run_sections(names: list[str], quick: bool) -> list[Check]:
    checks: list[Check] = []
    for name in names:
        start = time.perf_counter()
        section = importlib.import_module(_MODULES[name]).run(quick)
        seconds = time.perf_counter() - start
        print(f"== {name}: {len(section)} checks in {seconds:.0f} s", flush=True)
        checks += section
    return checks


def report(checks: list[Check]) -> None:
    width = max((len(c.name) for c in checks), default=4)
    for check in checks:
        print(f"{'ok  ' if check.ok else 'FAIL'} {check.name:{width}s} {check.detail}")
    failed = [c.name for c in checks if not c.ok]
    summary = f"{len(checks) - len(failed)}/{len(checks)} passed"
    print(summary + (f"; failed: {failed}" if failed else ""))
    if os.environ.get("OUT"):
        with open(os.path.join(os.environ["OUT"], "gpu_checks.json"), "w") as f:
            json.dump([c.__dict__ for c in checks], f, indent=1)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a small subset (CPU smoke test)")
    parser.add_argument("--only", default=",".join(SECTIONS), help="comma-separated sections")
    args = parser.parse_args(argv)
    names = [n for n in args.only.split(",") if n]
    unknown = sorted(set(names) - set(SECTIONS))
    if unknown:
        parser.error(f"unknown sections {unknown}; known: {list(SECTIONS)}")
    print(f"device={jax.devices()[0].device_kind} backend={jax.default_backend()}", flush=True)
    checks = run_sections(names, args.quick)
    report(checks)
    return 0 if checks and all(c.ok for c in checks) else 1


if __name__ == "__main__":
    sys.exit(main())
