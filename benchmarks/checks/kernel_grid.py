"""Every Pallas kernel against its plain-jnp reference on odd shapes (architecture.md section 7).

Each grid point is ONE call with many rows of different lengths (compiles dominate on the GPU):
lengths 1, chunk - 1, chunk, chunk + 1, 2 chunk + 2 and several chunks plus a remainder; rows that
continue a request (num_computed > 0) with and without an initial state; one row updated in place;
a padding row and padding tokens; 1 + K-lane decode rows with a dead lane; prefix-caching boundary
slots; NaN in slot 0 (it must stay NaN; every slot the op does not write must stay bit-identical).
Head dims 12, 24, 48, 80, 96 beside 64 and 128, head counts 1, 5, 6, 10, groups 1-3 and conv
channels that are not a multiple of the channel block each appear at least once per kernel, in fp32
and bf16. A check passes when ||out - ref|| / ||ref|| (live outputs, and written states) is within
the dtype's tolerance, padding outputs are exactly 0, and nothing is NaN.

All grid points compile first, in parallel threads (seconds printed apart from the runs); each then
runs under a time limit, so a hang is reported instead of blocking the report. The grid points
are built by `benchmarks/checks/kernels/` (one module per op family); this module lists them and
runs them.
"""

from __future__ import annotations

import os
import secrets
import time

import numpy as np

from benchmarks.checks import Check, on_gpu
from benchmarks.checks.kernels.attention import paged_decode, paged_prefill
from benchmarks.checks.kernels.case import BF16, F32, Case, Shape
from benchmarks.checks.kernels.conv import conv_prefill, conv_update
from benchmarks.checks.kernels.fp8_matmul import fp8_weight_matmul
from benchmarks.checks.kernels.gdn import gdn_chunk, gdn_decode, gdn_update
from benchmarks.checks.kernels.matmul import matmul
from benchmarks.checks.kernels.moe import fp8_grouped_matmul, grouped_matmul
from benchmarks.checks.kernels.norm import row_sum_squares
from benchmarks.checks.kernels.runner import check_shape, compile_all
from benchmarks.checks.kernels.ssd import mamba2_decode, ssd_scan, ssd_update
from pallas_kernels.ssd import reference as ssd_ref

__all__ = ["COMPILE_LIMIT_S", "OPS_ENV", "RUN_LIMIT_S", "Case", "Shape", "grid", "run", "selected"]

COMPILE_LIMIT_S, RUN_LIMIT_S = (300.0, 60.0) if on_gpu() else (600.0, 300.0)
OPS_ENV = "JMAMBA_CHECK_OPS"  # comma-separated ops: only their grid points run


def grid(quick: bool) -> list[Shape]:
    """The grid: each odd dimension at least once per kernel (quick: 1-2 small shapes each)."""
    if quick:
        return [
            conv_prefill(37, 4, F32, walk_tokens=8),
            conv_update(37, 4, 3, BF16),
            ssd_scan("sequential", 5, 12, 1, 24, F32, 16),
            ssd_scan("parallel", 6, 24, 3, 16, BF16, 16),
            ssd_update(5, 12, 1, 16, 2, F32),
            mamba2_decode(6, 24, 3, 24, 3, 2, BF16),
            gdn_chunk(1, 2, 24, 12, F32, chunk=16),
            gdn_update(1, 2, 24, 12, 2, BF16),
            gdn_decode(1, 2, 24, 12, 4, 2, F32),
            paged_decode(2, 6, 3, 24, 8, F32, (1, 9, 30)),
            paged_decode(2, 6, 3, 24, 8, BF16, (1, 9, 30), kv_cache="fp8"),
            paged_prefill(6, 3, 24, 8, F32, ((0, 1), (0, 19), (13, 6))),
            grouped_matmul(24, 12, 5, BF16),
            fp8_grouped_matmul(200, 72, 5, (128, 128), BF16),
            matmul(5, 80, 45, BF16, BF16),
            fp8_weight_matmul(3, 200, 300, (128, 128), BF16, BF16),
            row_sum_squares(7, 80, BF16),
        ]
    ssd_dims = [
        (5, 12, 1, 16, F32, 128),
        (6, 24, 2, 48, BF16, 256),
        (10, 48, 2, 128, F32, 256),
        (1, 64, 1, 24, BF16, 128),
        (6, 80, 3, 64, F32, 128),
        (5, 96, 1, 128, BF16, 256),
        (10, 128, 2, 64, F32, 128),
    ]
    ssu_dims = [
        (5, 12, 1, 16, 1, F32),
        (6, 24, 2, 48, 3, BF16),
        (10, 48, 2, 128, 2, F32),
        (1, 64, 1, 24, 1, BF16),
        (6, 80, 3, 64, 4, F32),
        (5, 96, 1, 128, 1, BF16),
        (10, 128, 2, 64, 2, F32),
    ]
    gdn_dims = [
        (1, 1, 24, 80, F32),
        (5, 10, 12, 96, BF16),
        (2, 6, 48, 64, F32),
        (3, 6, 80, 24, BF16),
        (1, 5, 96, 128, F32),
        (6, 6, 128, 12, BF16),
        (2, 10, 64, 48, F32),
    ]
    return [
        conv_prefill(37, 4, F32),
        conv_prefill(1000, 4, BF16, walk_tokens=128),
        conv_prefill(200, 3, F32, walk_tokens=4),
        conv_update(37, 4, 1, F32),
        conv_update(1000, 4, 3, BF16),
        *(ssd_scan(a, *d) for a in ssd_ref.ALGORITHMS for d in ssd_dims),
        # The Mosaic GPU scan (bf16, P 64, N 64 / 128), and the models' path through _dispatch.
        ssd_scan("sequential", 5, 64, 1, 128, BF16, 256, hopper=True),
        ssd_scan("sequential", 6, 64, 3, 64, BF16, 128, hopper=True),
        ssd_scan("sequential", 10, 64, 5, 128, BF16, 64, hopper=True),
        ssd_scan("sequential", 6, 64, 2, 128, BF16, 128, hopper=True, caching=False),
        # Output programs serving several heads of a group (3 of 3, 5 of 5).
        ssd_scan("parallel", 6, 24, 2, 48, BF16, 256, heads_per_program=3),
        ssd_scan("parallel", 10, 48, 2, 128, F32, 256, heads_per_program=5),
        *(ssd_update(*d) for d in ssu_dims),
        mamba2_decode(5, 12, 1, 16, 4, 1, F32),
        mamba2_decode(6, 24, 3, 24, 3, 2, BF16),
        mamba2_decode(6, 80, 2, 16, 2, 3, F32),
        mamba2_decode(10, 48, 2, 128, 4, 4, BF16),
        mamba2_decode(64, 64, 8, 128, 4, 1, BF16),  # the bench model's layer
        *(gdn_chunk(*d) for d in gdn_dims),
        # The Mosaic GPU chain the models run on Hopper: GQA 2 / 3, K 128 / 64.
        gdn_chunk(1, 2, 128, 128, BF16, hopper=True),
        gdn_chunk(2, 6, 64, 192, BF16, hopper=True),
        gdn_chunk(2, 4, 128, 64, BF16, hopper=True, caching=False),
        # The chain's pipeline stages at K = 128 (shared memory bound): fp32 tiles at chunk 64,
        # bf16 at chunk 128.
        gdn_chunk(1, 2, 128, 128, F32),
        gdn_chunk(2, 4, 128, 128, BF16, chunk=128),
        *(gdn_update(*d[:4], 1 + i % 3, d[4]) for i, d in enumerate(gdn_dims)),
        gdn_decode(1, 1, 24, 80, 4, 1, F32),
        gdn_decode(5, 10, 12, 96, 3, 2, BF16),
        gdn_decode(3, 6, 80, 24, 2, 3, F32),
        gdn_decode(2, 6, 128, 48, 4, 4, BF16),
        gdn_decode(16, 32, 128, 128, 4, 1, BF16),  # a Qwen3-Next-shaped layer
        paged_decode(1, 16, 4, 128, 16, BF16, (1, 17, 1000, 8200)),
        paged_decode(3, 6, 3, 24, 8, F32, (1, 9, 300, 4100)),
        paged_decode(2, 5, 1, 80, 32, BF16, (2, 63, 5000)),
        paged_decode(4, 10, 5, 12, 16, F32, (1, 33, 700)),
        paged_decode(1, 16, 4, 128, 16, BF16, (1, 17, 1000, 8200), kv_cache="fp8"),
        paged_decode(3, 6, 3, 24, 8, F32, (1, 9, 300, 4100), kv_cache="fp8"),
        paged_prefill(16, 2, 256, 16, BF16, ((0, 1), (0, 517), (300, 91), (1000, 1))),  # Qwen3-Next
        paged_prefill(64, 8, 128, 16, BF16, ((0, 333), (17, 64), (0, 2))),  # Nemotron-H (G = 8)
        paged_prefill(6, 3, 24, 8, F32, ((0, 1), (0, 19), (13, 6), (40, 33))),
        paged_prefill(5, 1, 80, 32, BF16, ((0, 130), (64, 65))),
        paged_prefill(10, 5, 12, 16, F32, ((100, 300), (0, 16), (5, 1))),
        paged_prefill(16, 2, 256, 16, BF16, ((0, 1), (0, 517), (300, 91)), kv_cache="fp8"),
        paged_prefill(5, 1, 80, 32, BF16, ((0, 130), (64, 65)), kv_cache="fp8"),
        grouped_matmul(24, 12, 5, F32),
        grouped_matmul(80, 96, 7, BF16),
        grouped_matmul(80, 96, 7, BF16, BF16),
        grouped_matmul(2048, 512, 24, BF16),  # Qwen3-Next's up / gate shape, fewer experts
        grouped_matmul(512, 2048, 24, F32),  # and its down shape
        fp8_grouped_matmul(200, 72, 5, (128, 128), BF16),  # two K groups, the last of 72 rows
        fp8_grouped_matmul(130, 300, 7, (0, 1), BF16, BF16),  # per channel, bf16 out
        fp8_grouped_matmul(80, 96, 3, (0, 0), F32),  # per tensor, fp32 rows
        fp8_grouped_matmul(2048, 512, 24, (128, 128), BF16),  # Qwen3-Next's FP8 up / gate
        fp8_grouped_matmul(512, 2048, 24, (128, 128), BF16, BF16),  # and its down
        matmul(1, 24, 12, F32),
        matmul(37, 200, 45, BF16, BF16),
        matmul(70, 1100, 96, F32),
        matmul(9, 4096, 2048, BF16, BF16),  # the 0.87B model's out_proj: K split in 8
        matmul(300, 8192, 2048, BF16, BF16),  # and its MLP's down: K in 8 (3 row tiles)
        matmul(17, 2048, 32000, BF16),  # its head, fp32 logits
        fp8_weight_matmul(1, 200, 300, (0, 1), BF16),
        fp8_weight_matmul(3, 200, 300, (128, 128), BF16, BF16),
        fp8_weight_matmul(17, 200, 300, (0, 0), F32),
        fp8_weight_matmul(17, 130, 260, (128, 128), BF16),
        fp8_weight_matmul(9, 2048, 8192, (128, 128), BF16, BF16),  # the 0.87B model's MLP up
        fp8_weight_matmul(5, 8192, 2048, (0, 1), BF16, BF16),  # and down: K split in 4
        fp8_weight_matmul(300, 4096, 2048, (128, 128), BF16, BF16),  # out_proj, 19 row tiles
        row_sum_squares(1, 24, F32),
        row_sum_squares(37, 2048, BF16),  # the 0.87B model's hidden size
        row_sum_squares(1500, 512, F32),  # its gated norm's groups, rows of a prefill step
        row_sum_squares(5, 9000, BF16),  # rows walked in three slices
    ]


def op_of(shape: Shape) -> str:
    """The op a grid point checks: the first word of its name ("matmul", "gdn_chunk", ...)."""
    return shape.name.split()[0]


def selected(shapes: list[Shape], ops: str) -> list[Shape]:
    """The grid points of the comma-separated `ops` (every point when empty); ValueError naming
    the known ops for an op the grid does not have."""
    wanted = [op for op in ops.split(",") if op]
    known = sorted({op_of(shape) for shape in shapes})
    unknown = sorted(set(wanted) - set(known))
    if unknown:
        raise ValueError(f"{OPS_ENV}: no grid points for {unknown}; the grid's ops: {known}")
    return [shape for shape in shapes if not wanted or op_of(shape) in wanted]


def run(quick: bool, families: list[str] | None = None) -> list[Check]:
    """Every kernel against its reference on the odd-shape grid, or the ops named in
    $JMAMBA_CHECK_OPS (`gpu_checks.py --ops`; `families` does not apply)."""
    del families
    seed = int(os.environ.get("JMAMBA_CHECK_SEED", secrets.randbelow(2**31)))
    print(f"kernel grid: seed {seed} (set JMAMBA_CHECK_SEED to repeat it)", flush=True)
    shapes = selected(grid(quick), os.environ.get(OPS_ENV, ""))
    cases = [s.build(np.random.default_rng(seed + i)) for i, s in enumerate(shapes)]
    start = time.perf_counter()
    compiled = compile_all(cases, workers=min(16, os.cpu_count() or 1))
    deadline = time.time() + COMPILE_LIMIT_S
    checks: list[Check] = []
    hung = False
    for shape, case, future in zip(shapes, cases, compiled, strict=True):
        if hung:  # the device is stuck behind the hung kernel: say so instead of waiting again
            checks.append(Check(shape.name, False, "not run: an earlier kernel hung"))
            continue
        print(f"kernel grid: {shape.name}", flush=True)
        try:
            checks.append(check_shape(shape, case, future, deadline, COMPILE_LIMIT_S, RUN_LIMIT_S))
        except TimeoutError:
            hung = True
            checks.append(Check(shape.name, False, f"hung: no result within {RUN_LIMIT_S:.0f} s"))
        except Exception as e:  # a failure to compile or run is a failed check, not a crash
            checks.append(Check(shape.name, False, f"{type(e).__name__}: {str(e)[:300]}"))
    done = [f.result()[2] for f in compiled if f.done() and not f.exception()]
    wall = time.perf_counter() - start
    longest = max(done, default=0.0)
    print(
        f"kernel grid: {len(cases)} shapes in {wall:.0f} s wall; {len(done)} compiles took "
        f"{sum(done):.0f} s in all, the longest {longest:.0f} s",
        flush=True,
    )
    return checks
