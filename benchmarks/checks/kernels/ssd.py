"""Grid points of the Mamba2 (SSD) kernels: the chunk scan, the state update, the fused decode."""

from __future__ import annotations

import functools
from collections.abc import Callable

import jax.numpy as jnp
import numpy as np

from benchmarks.checks.kernels.case import F32, TOLERANCE, Case, Shape, without_interpret
from benchmarks.checks.kernels.fused_decode import fused_decode_case
from benchmarks.checks.kernels.layouts import (
    lane_live,
    lanes,
    normal,
    random_pool,
    row_lengths,
    varlen,
)
from pallas_kernels.ssd import chunk_scan as ssd
from pallas_kernels.ssd import decode as m2d
from pallas_kernels.ssd import reference as ssd_ref
from pallas_kernels.ssd import sequential_mgpu as ssd_hopper
from pallas_kernels.ssd import state_update as ssu


def ssd_scan(
    algorithm: str,
    heads: int,
    head_dim: int,
    groups: int,
    state: int,
    dtype,
    chunk: int,
    heads_per_program: int | None = None,
    hopper: bool = False,
    caching: bool = True,
) -> Shape:
    """The scan with its default tuning, or with `heads_per_program` heads an output program;
    with `hopper`, the Mosaic GPU kernel (`ssd/sequential_mgpu.py`; sm_90 only); without
    `caching`, rows without boundary slots (the calls of an engine without prefix caching)."""
    kernel = ssd.ssd_chunk_scan
    if hopper:
        kernel = without_interpret(ssd_hopper.ssd_chunk_scan_hopper)
    if heads_per_program is not None:
        kernel = functools.partial(
            kernel, tuning=ssd.ScanTuning(heads_per_program=heads_per_program)
        )

    def build(rng) -> Case:
        rows = varlen(rng, row_lengths(chunk), chunk)
        t = rows.num_tokens
        args = (
            normal(rng, (t, heads, head_dim), dtype),
            normal(rng, (t, heads), dtype, 1.0, -1.0),
            -np.exp(normal(rng, (heads,), F32, 0.5)),
            normal(rng, (t, groups, state), dtype, state**-0.5),
            normal(rng, (t, groups, state), dtype, state**-0.5),
            random_pool(rng, rows.num_slots, (heads, head_dim, state), F32),
            rows.as_rows(chunk if caching else None),
            normal(rng, (heads,)),
            normal(rng, (t, heads, head_dim), dtype),
            normal(rng, (heads,), F32, 0.5),
        )

        def call(fn, *a, **kw):
            d, z, bias = a[7:]
            return fn(*a[:7], D=d, z=z, dt_bias=bias, chunk_size=chunk, algorithm=algorithm, **kw)

        return Case(
            functools.partial(call, kernel),
            functools.partial(call, ssd_ref.ssd_chunk_scan_reference),
            args,
            5,
            rows.live[:, None, None],
            rows.written,
            TOLERANCE[dtype, "scan"],
            rows.describe(),
        )

    dims = f"H={heads} P={head_dim} G={groups} N={state} chunk={chunk}"
    dims += "" if heads_per_program is None else f" heads/program={heads_per_program}"
    dims += "" if caching else " uncached"
    name = "hopper" if hopper else algorithm
    return Shape(f"ssd_chunk_scan {name} {dims} {jnp.dtype(dtype).name}", build)


def ssd_update(
    heads: int, head_dim: int, groups: int, state: int, num_lanes: int, dtype, batch: int = 6
) -> Shape:
    def build(rng) -> Case:
        read, write, num_slots = lanes(rng, batch, num_lanes)
        lead = (batch, num_lanes)
        args = (
            normal(rng, (*lead, heads, head_dim), dtype),
            normal(rng, (*lead, heads), dtype, 1.0, -1.0),
            -np.exp(normal(rng, (heads,), F32, 0.5)),
            normal(rng, (*lead, groups, state), dtype, state**-0.5),
            normal(rng, (*lead, groups, state), dtype, state**-0.5),
            random_pool(rng, num_slots, (heads, head_dim, state), F32),
            read,
            write,
            normal(rng, (heads,)),
            normal(rng, (*lead, heads, head_dim), dtype),
            normal(rng, (heads,), F32, 0.5),
        )

        def call(fn, *a, **kw):
            return fn(*a[:8], D=a[8], z=a[9], dt_bias=a[10], **kw)

        return Case(
            functools.partial(call, ssu.ssd_state_update),
            functools.partial(call, ssd_ref.ssd_state_update_reference),
            args,
            5,
            lane_live(write, 2),
            write.ravel(),
            TOLERANCE[dtype, "update"],
            f"B={batch} L={num_lanes}",
        )

    dims = f"H={heads} P={head_dim} G={groups} N={state} L={num_lanes}"
    return Shape(f"ssd_state_update {dims} {jnp.dtype(dtype).name}", build)


def _with_d(fn: Callable) -> Callable:
    """mamba2_decode with D and dt_bias positional after A (as `fused_decode_case` calls it)."""

    def call(zxbcdt, weight, bias, conv_state, ssm_state, a, d, dt_bias, read, write, **kw):
        return fn(
            zxbcdt, weight, bias, conv_state, ssm_state, a, read, write, D=d, dt_bias=dt_bias, **kw
        )

    return call


def mamba2_decode(
    heads: int,
    head_dim: int,
    groups: int,
    state: int,
    width: int,
    num_lanes: int,
    dtype,
    batch: int = 6,
) -> Shape:
    d_inner = heads * head_dim
    conv_dim = d_inner + 2 * groups * state

    def build(rng) -> Case:
        after = (
            -np.exp(normal(rng, (heads,), F32, 0.5)),
            normal(rng, (heads,)),
            normal(rng, (heads,), F32, 0.5),
        )
        fns = (_with_d(m2d.mamba2_decode), _with_d(ssd_ref.mamba2_decode_reference))
        tails = (conv_dim, width - 1), (heads, head_dim, state)
        return fused_decode_case(
            rng, fns, d_inner + conv_dim + heads, *tails, after, num_lanes, dtype, batch
        )

    dims = f"H={heads} P={head_dim} G={groups} N={state} W={width} L={num_lanes}"
    return Shape(f"mamba2_decode {dims} {jnp.dtype(dtype).name}", build)
