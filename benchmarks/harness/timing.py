"""Jitted timing loops on the device, the host's round trip cancelled, and the helpers the kernel
benches share: the run's RESULT lines, relative errors, copies of a loop's inputs and the copy
bandwidth.

JAX side: jitted calls after a warm-up, median of many; each timed call runs `inner` kernel calls
in one unrolled loop (so JAX's ~40 us dispatch is amortised) and the host's round trip of a timing
cancels (`device_seconds`).
"""

from __future__ import annotations

import functools
import json
import statistics
import time
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

F32 = jnp.float32
RESULTS: list[dict] = []  # the rows `record` printed in this process


def log(*a: object) -> None:
    print(*a, flush=True)


def record(**row: Any) -> None:
    """One result row: kept in RESULTS and printed as a `RESULT {json}` line."""
    RESULTS.append(row)
    log("RESULT", json.dumps(row, default=str))


def rel_err(a: Any, b: Any) -> float:
    """RMS of a - b over the RMS of b."""
    a, b = np.asarray(a, np.float32), np.asarray(b, np.float32)
    return float(np.sqrt(np.mean((a - b) ** 2)) / (np.sqrt(np.mean(b**2)) + 1e-12))


def unrolled(step: Callable, calls: int, carry: tuple, inputs: Any = ()) -> tuple:
    """`calls` calls of `step(i, state, inputs) -> (y, state)` in a row, i a Python int; the
    carry is (state, sum of a scalar of every y)."""
    state, acc = carry
    for i in range(calls):
        y, state = step(i, state, inputs)
        acc = acc + y.reshape(-1)[0].astype(F32)
    return state, acc


def input_sets(arrays: tuple[jax.Array, ...], count: int) -> list[tuple[jax.Array, ...]]:
    """`arrays` and `count - 1` copies of them in their own buffers: the `inputs` of a
    `time_loop` whose call i reads set i % count.

    XLA merges calls of one program that read the same values and do not depend on the carried
    state (CSE), and it sees the values of arrays a step closes over (they are lowered as
    constants). In issue 14's first timings the SSD chunk-state and C B^T kernels and the GDN
    intra kernel ran once per loop of calls, not once per call, that way.
    """
    return [arrays] + [tuple(jnp.copy(a) for a in arrays) for _ in range(count - 1)]


def time_loop(step: Callable, pool: Any, inner: int, reps: int = 15, inputs: Any = ()) -> float:
    """Median microseconds per call of `step(i, pool, inputs) -> (y, pool)`.

    One jitted, fully unrolled loop of `inner` calls; `step` gets its call's index as a Python
    int and `inputs` as arguments of the loop (see `input_sets`). A scalar of every y is summed
    into the carry so no kernel can be dead-code eliminated. Each timing is `device_seconds` of
    the loop.
    """
    loop = jax.jit(functools.partial(unrolled, step, inner), donate_argnums=0)
    carry = (pool, jnp.zeros((), F32))
    return device_seconds(lambda c: loop(c, inputs), carry, reps) / inner * 1e6


def device_seconds(step: Callable, state: Any, reps: int, chain: int = 5) -> float:
    """Median seconds of one `state = step(state)` on the device, host round trip excluded (one
    untimed call first compiles and warms it).

    A timing that dispatches one call and waits for it also pays the host's side of the round trip:
    a traced H200 run showed 0.55-0.64 ms of idle GPU between one timed loop's last kernel and the
    next loop's first, a fifth of a loop of eight 0.28 ms kernels
    (benchmarks/results/log/2026-11-27.md, "Timing harness"). So each timing runs `chain` calls back
    to back (each dispatched while the one before runs) and once alone, and takes the difference
    over `chain - 1`: the round trip cancels.
    """
    state = jax.block_until_ready(step(state))

    def timed(calls: int) -> float:
        nonlocal state
        t0 = time.perf_counter()
        for _ in range(calls):
            state = step(state)
        jax.block_until_ready(state)
        return time.perf_counter() - t0

    return statistics.median((timed(chain) - timed(1)) / (chain - 1) for _ in range(reps))


def copy_bandwidth() -> float:
    """Read + write TB/s of a jitted `a + 1` over 1 GiB of fp32, the host's round trip excluded
    (`device_seconds`). (Run 2 fused 20 unrolled multiplies into one pass and reported 47.9 TB/s;
    separate jitted calls cannot be fused.)"""
    add = jax.jit(lambda a: a + 1.0, donate_argnums=0)
    x = jnp.ones((256 * 1024 * 1024,), F32)
    nbytes = 2 * x.nbytes
    return nbytes / device_seconds(add, x, reps=20, chain=10) / 1e12


def time_calls_in_loop(fn: Callable, args: tuple, calls: int) -> float:
    """Seconds per call of fn(*args), `calls` calls inside one jitted loop, median of 5."""

    @jax.jit
    def loop(q: jax.Array, *rest: Any) -> jax.Array:
        def body(_: int, acc: jax.Array) -> jax.Array:
            return acc + fn(q + acc.astype(q.dtype) * 0, *rest).astype(jnp.float32)

        return jax.lax.fori_loop(0, calls, body, jnp.zeros(q.shape, jnp.float32))

    loop(*args).block_until_ready()
    times = []
    for _ in range(5):
        start = time.perf_counter()
        loop(*args).block_until_ready()
        times.append((time.perf_counter() - start) / calls)
    return float(np.median(times))
