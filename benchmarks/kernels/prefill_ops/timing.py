"""Timing a prefill case: every tuning config timed and recorded, then the fastest config's
per-kernel breakdown from a profiler trace and the anchor timed beside it."""

from __future__ import annotations

import collections
import functools
import tempfile

import jax
import jax.numpy as jnp

from benchmarks.harness.timing import log, record, time_loop, unrolled
from benchmarks.harness.trace import load_trace, profile_events
from benchmarks.kernels.prefill_ops.case import F32, Case, Inputs, Step


def kernel_breakdown(
    step: Step, state: jax.Array, inputs: Inputs, inner: int = 3
) -> dict[str, float]:
    """Microseconds per call of each GPU kernel of `step`, from one profiled jitted loop.

    A scalar of every output is carried, as in `time_loop`: a loop that kept only the state let
    XLA drop every kernel that writes only the output (the first breakdowns of issue 14 missed the
    SSD output and C B^T kernels and the conv kernel that way).
    """

    loop = jax.jit(functools.partial(unrolled, step, inner))
    carry = jax.block_until_ready(loop((state, jnp.zeros((), F32)), inputs))
    with tempfile.TemporaryDirectory() as trace_dir:
        with jax.profiler.trace(trace_dir):
            jax.block_until_ready(loop(carry, inputs))
        events = profile_events(load_trace(trace_dir))
    per, launches = collections.defaultdict(float), collections.Counter()
    for line, name, _, dur, _ in events:
        if "Stream" in line or "stream" in line:
            per[name[:60]] += dur / 1e3 / inner
            launches[name[:60]] += 1
    for name, count in launches.items():
        if count % inner:  # a kernel merged across calls would show here
            log(f"kernel {name}: {count} launches in {inner} calls")
    return dict(sorted(per.items(), key=lambda kv: -kv[1]))


def sweep(
    case: Case, shape: str, configs: list[dict], bw: float, inner: int
) -> tuple[float, dict, Step]:
    """Time every config (`inner` calls per timed loop), record each; returns (us, config, step)
    of the fastest, or None."""
    best = None
    for cfg in configs:
        step = case.make_step(cfg)
        try:
            err = case.check(lambda state, step=step: step(0, state, case.inputs))
            us = time_loop(step, jnp.copy(case.state), inner=inner, reps=10, inputs=case.inputs)
        except Exception as e:  # noqa: BLE001  (a config that does not compile is reported)
            log(f"{case.op} {shape} {cfg} FAILED: {e!r}"[:600])
            continue
        pct = 100 * case.nbytes / (us * 1e-6) / (bw * 1e12)
        record(op=case.op, shape=shape, config=cfg, ours_us=us, pct_roofline=pct, **err)
        if best is None or us < best[0]:
            best = (us, cfg, step)
    return best


def run_case(
    case: Case, shape: str, configs: list[dict], bw: float, anchors, *, quick: bool, profile: bool
) -> dict | None:
    """Sweep (or, with `profile`, only build the first config), then on the GPU the fastest
    config's kernel breakdown and the anchor beside it. Returns the fastest config."""
    if profile:
        best = (float("nan"), configs[0], case.make_step(configs[0]))
    else:
        # `quick`: one call per loop; many calls of an interpreted kernel take long to compile
        # and time nothing on a CPU
        best = sweep(case, shape, configs, bw, 1 if quick else case.inner)
    if best is None or quick:
        return best and best[1]
    breakdown = kernel_breakdown(best[2], case.state, case.inputs)
    record(op=case.op, shape=shape, config=best[1], breakdown_us=breakdown)
    if anchors is not None and not profile:
        fields = case.anchor(anchors)
        record(
            op=case.op,
            shape=shape,
            ours_best_us=best[0],
            ratio=fields["anchor_us"] / best[0],
            **fields,
        )
    return best[1]
