"""Running the grid's cases: every kernel and reference compiled ahead of time in daemon threads,
then each case run under a time limit (a hung kernel raises instead of blocking the report) and
judged against its reference."""

from __future__ import annotations

import concurrent.futures
import functools
import threading
import time
from collections.abc import Callable

import jax

from benchmarks.checks import Check, on_gpu
from benchmarks.checks.kernels.case import Case, Shape, judge


def in_daemon_thread(fn: Callable) -> concurrent.futures.Future:
    """Run fn in a daemon thread (a hung kernel must not keep the process alive at exit)."""
    future: concurrent.futures.Future = concurrent.futures.Future()

    def target():
        try:
            future.set_result(fn())
        except BaseException as e:  # reported by the caller
            future.set_exception(e)

    threading.Thread(target=target, daemon=True).start()
    return future


def compile_all(cases: list[Case], workers: int) -> list[concurrent.futures.Future]:
    """Compile every kernel and reference ahead of time, `workers` at a time."""
    gate = threading.Semaphore(workers)

    def compile_one(case: Case):
        with gate:
            start = time.perf_counter()
            kernel = functools.partial(case.kernel, interpret=not on_gpu())
            kernel = jax.jit(kernel).lower(*case.args).compile()
            reference = jax.jit(case.reference).lower(*case.args).compile()
            return kernel, reference, time.perf_counter() - start

    return [in_daemon_thread(functools.partial(compile_one, c)) for c in cases]


def check_shape(
    shape: Shape,
    case: Case,
    compiled: concurrent.futures.Future,
    deadline: float,
    compile_limit_s: float,
    run_limit_s: float,
) -> Check:
    """Wait for the shape's compile (until `deadline`, which is `compile_limit_s` after the
    compiles started), run the kernel under `run_limit_s`, judge it against the reference. Raises
    TimeoutError("run") when the kernel does not finish."""
    try:
        kernel, reference, seconds = compiled.result(timeout=max(1.0, deadline - time.time()))
    except concurrent.futures.TimeoutError:
        return Check(shape.name, False, f"compile did not finish within {compile_limit_s:.0f} s")
    print(f"  compiled in {seconds:.1f} s", flush=True)
    start = time.perf_counter()
    running = in_daemon_thread(functools.partial(call_and_wait, kernel, case.args))
    try:
        out, pool = running.result(timeout=run_limit_s)
    except concurrent.futures.TimeoutError:
        raise TimeoutError("run") from None
    run_ms = (time.perf_counter() - start) * 1e3
    ok, detail = judge(case, out, pool, call_and_wait(reference, case.args))
    return Check(shape.name, ok, f"{detail}; compile {seconds:.0f} s, run {run_ms:.0f} ms")


def call_and_wait(fn: Callable, args: tuple):
    return jax.block_until_ready(fn(*args))
