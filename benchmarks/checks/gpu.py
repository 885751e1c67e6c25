"""Every kernel and model through the compiled kernels, checked against independent references.

One run on the GPU; exits 1 if any check fails. Sections (each a module of `benchmarks/checks/`):
  kernels   every Pallas kernel against its plain-jnp reference on a grid of odd shapes
  fixtures  every transformers fixture (tests/fixtures) through the compiled kernels
  batch     a request's prefill output does not depend on the batch it shares (architecture.md 5.8)
  bf16      the same, bitwise, for the bf16 bench model under EngineConfig.batch_invariant
  tp        tensor parallelism: each fixture on one GPU and split over --tp (x --dp) GPUs;
            not run by default (it needs several GPUs)
  fp8       FP8 checkpoints (written from the fixtures) through the GPU's FP8 products and FP8
            KV cache against their dequantized twins, and at tp=2 with two GPUs; not default

    PYTHONPATH=. python benchmarks/gpu_checks.py [--quick] [--only kernels,fixtures,batch]
        [--families mamba2,qwen3_5_odd] [--ops matmul,row_sum_squares] [--jobs 8]
    python -m benchmarks.checks gpu ...                 # the same, through the suite's entry
    PYTHONPATH=. python benchmarks/gpu_checks.py --only tp --tp 2 --dp 1 --families qwen3_next

Compiling dominates on the GPU (an fp32 `gdn_chunk` takes ~45 s), so `--jobs N` runs the kernel
grid and each (section, fixture) pair in its own process, N at a time, all on the one GPU (no
memory preallocation), and gathers their checks into one report.
`--quick` runs a small subset; on a CPU the kernels run in interpret mode (the CI smoke test
does this).
Results are printed as a table and, when $OUT is set, written to $OUT/gpu_checks.json.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import importlib
import json
import os
import subprocess
import tempfile
import time

import jax

from benchmarks.checks import Check, tensor_parallel
from benchmarks.harness.suite import bench_command, repo_on_path

SECTIONS = ("kernels", "fixtures", "batch", "bf16")  # the default run
_MODULES = {
    "kernels": "benchmarks.checks.kernel_grid",
    "fixtures": "benchmarks.checks.fixtures",
    "batch": "benchmarks.checks.batch_invariance",
    "bf16": "benchmarks.checks.bf16_batch",
    "tp": "benchmarks.checks.tensor_parallel",
    "fp8": "benchmarks.checks.fp8",
}
_PER_FIXTURE = ("fixtures", "batch")  # sections run once per fixture family


def run_sections(names: list[str], quick: bool, families: list[str] | None) -> list[Check]:
    checks: list[Check] = []
    for name in names:
        start = time.perf_counter()
        section = importlib.import_module(_MODULES[name]).run(quick, families)
        seconds = time.perf_counter() - start
        print(f"== {name}: {len(section)} checks in {seconds:.0f} s", flush=True)
        checks += section
    return checks


def run_in_processes(
    names: list[str], quick: bool, families: list[str] | None, jobs: int
) -> list[Check]:
    """Each section (per fixture for fixtures and batch) in a child process, `jobs` at a time."""
    from tests.jmamba import fixture_runs

    every = families or fixture_runs.ALL
    tasks = [(n, None) for n in names if n not in _PER_FIXTURE]
    tasks += [(n, [f]) for n in names if n in _PER_FIXTURE for f in every]
    env = repo_on_path(dict(os.environ, XLA_PYTHON_CLIENT_PREALLOCATE="false"))
    env.pop("OUT", None)

    def child(task: tuple[str, list[str] | None]) -> list[Check]:
        name, fams = task
        with tempfile.NamedTemporaryFile(suffix=".json") as out:
            flags = ["--only", name, "--json", out.name] + (["--quick"] if quick else [])
            argv = bench_command("benchmarks.checks", "gpu", *flags)
            argv += ["--families", fams[0]] if fams else []
            done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=580)
            print(
                f"== {name} {fams or ''}: exit {done.returncode}\n{done.stdout[-4000:]}", flush=True
            )
            try:
                return [Check(**c) for c in json.load(open(out.name))]
            except (OSError, ValueError):
                tail = (done.stdout + done.stderr)[-300:].replace("\n", " | ")
                return [Check(f"{name} {fams or ''}", False, f"no result: {tail}")]

    with concurrent.futures.ThreadPoolExecutor(jobs) as pool:
        return [c for checks in pool.map(child, tasks) for c in checks]


def report(checks: list[Check], json_path: str | None = None) -> None:
    width = max((len(c.name) for c in checks), default=4)
    for check in checks:
        print(f"{'ok  ' if check.ok else 'FAIL'} {check.name:{width}s} {check.detail}")
    failed = [c.name for c in checks if not c.ok]
    summary = f"{len(checks) - len(failed)}/{len(checks)} passed"
    print(summary + (f"; failed: {failed}" if failed else ""))
    if json_path is None and os.environ.get("OUT"):
        json_path = os.path.join(os.environ["OUT"], "gpu_checks.json")
    if json_path:
        with open(json_path, "w") as f:
            json.dump([c.__dict__ for c in checks], f, indent=1)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a small subset (CPU smoke test)")
    parser.add_argument(
        "--only", default=",".join(SECTIONS), help=f"comma-separated sections of {list(_MODULES)}"
    )
    parser.add_argument("--families", help="comma-separated fixtures (fixtures, batch, tp)")
    parser.add_argument(
        "--ops", help="comma-separated ops, e.g. matmul,gdn_chunk: only their kernel grid points"
    )
    parser.add_argument("--jobs", type=int, default=1, help="child processes at a time")
    parser.add_argument("--json", help="where to write the checks (default $OUT/gpu_checks.json)")
    parser.add_argument("--tp", type=int, default=2, help="the tp section's tensor-parallel size")
    parser.add_argument("--dp", type=int, default=1, help="the tp section's data-parallel size")
    args = parser.parse_args(argv)
    families = args.families.split(",") if args.families else None
    names = [n for n in args.only.split(",") if n]
    unknown = sorted(set(names) - set(_MODULES))
    if unknown:
        parser.error(f"unknown sections {unknown}; known: {list(_MODULES)}")
    if "tp" in names:  # read by the tp section, here and in the child processes of --jobs
        os.environ[tensor_parallel.MESH_ENV] = f"{args.dp}x{args.tp}"
    if args.ops:  # read by the kernel section, here and in the child processes of --jobs
        from benchmarks.checks import kernel_grid

        try:
            kernel_grid.selected(kernel_grid.grid(args.quick), args.ops)
        except ValueError as e:
            parser.error(str(e))
        os.environ[kernel_grid.OPS_ENV] = args.ops
    print(f"device={jax.devices()[0].device_kind} backend={jax.default_backend()}", flush=True)
    if args.jobs > 1:
        checks = run_in_processes(names, args.quick, families, args.jobs)
    else:
        checks = run_sections(names, args.quick, families)
    report(checks, args.json)
    return 0 if checks and all(c.ok for c in checks) else 1
