"""The fixed-tile matmul (`pallas_kernels.ops.matmul`, the batch-invariant projections) beside
XLA's GEMM (cuBLAS on the GPU: what the model runs without `EngineConfig.batch_invariant`).

Shapes: the 0.87B bench model's projections (bf16; the head in fp32 out). For each M (decode
rows and lanes, and a prefill chunk): microseconds per product, each timed as a jitted program of
8 products over 4 weight copies (so the weight is not served from L2 by the product before),
queued 20 times back to back, the median of 5 such runs; the ratio XLA / ours (above 1: ours is
faster); and the weight's bytes over the time as a share of `--bandwidth`. Compile seconds are
printed apart. `--tunings sweep` also times other launch knobs (`SWEEP`) at `--sweep-ms`.

Beside the time, the rounding: row 0 of `x[:M] @ w` against the same row computed alone (M = 1):
how many of its N outputs differ bitwise, for XLA's GEMM and for ours (0 everywhere for ours is
the point; the history is in benchmarks/results/log/2026-11-26.md, "Why a draft equal to the
target is not always accepted in bf16").

    JMAMBA_KERNELS=interpret python -m benchmarks.kernels matmul --ms 1,3 --shapes 64x48  # CPU
    python -m benchmarks.kernels matmul                                                 # GPU
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import os
import statistics
import time

import jax
import jax.numpy as jnp
import numpy as np

from pallas_kernels import ops
from pallas_kernels.matmul.fixed_tiles import MatmulTuning, matmul, plan

# (name, K, N, out dtype): the 0.87B bench model's projections.
SHAPES = {
    "mamba_in": (2048, 10304, jnp.bfloat16),
    "mamba_out": (4096, 2048, jnp.bfloat16),
    "mlp_up": (2048, 8192, jnp.bfloat16),
    "mlp_down": (8192, 2048, jnp.bfloat16),
    "head": (2048, 32000, jnp.float32),
}
SWEEP = {
    "m32": dict(block_m=32),
    "m64_n128_w8": dict(block_m=64, block_n=128, num_warps=8, num_stages=3),
    "m64_n128_w8_p64": dict(block_m=64, block_n=128, num_warps=8, num_stages=3, min_programs=64),
    "m128_n128_w8": dict(block_m=128, block_n=128, num_warps=8, num_stages=3),
    "m128_n128_w8_p64": dict(block_m=128, block_n=128, num_warps=8, num_stages=3, min_programs=64),
    "m64_n64_w4_s3": dict(block_m=64, num_stages=3),
}
COPIES, PER_PROGRAM, QUEUED, RUNS = 4, 8, 20, 5


def products(product, xs: list[jax.Array], ws: list[jax.Array]) -> jax.Array:
    """PER_PROGRAM products, weight copies in turn, summed so that none is dropped."""
    total = jnp.zeros((), jnp.float32)
    for i in range(PER_PROGRAM):
        total += product(xs[i % COPIES], ws[i % COPIES])[0, 0].astype(jnp.float32)
    return total


def time_product(product, xs, ws) -> tuple[float, float]:
    """(us per product, compile seconds)."""
    fn = jax.jit(functools.partial(products, product))
    start = time.perf_counter()
    fn(xs, ws).block_until_ready()
    compile_s = time.perf_counter() - start
    runs = []
    for _ in range(RUNS):
        start = time.perf_counter()
        for _ in range(QUEUED):
            out = fn(xs, ws)
        out.block_until_ready()
        runs.append((time.perf_counter() - start) / (QUEUED * PER_PROGRAM))
    return statistics.median(runs) * 1e6, compile_s


def xla_product(out_dtype):
    return lambda x, w: jnp.dot(x, w, preferred_element_type=out_dtype)


def fixed_product(out_dtype, tuning: MatmulTuning | None = None):
    """Ours: as the model calls it, or under other launch knobs."""
    if tuning is None:
        return lambda x, w: ops.matmul(x, w, out_dtype=out_dtype)
    interpret = jax.default_backend() != "gpu"
    return lambda x, w: matmul(x, w, out_dtype=out_dtype, tuning=tuning, interpret=interpret)


def row_zero_differs(rows_of, m: int) -> int:
    """Outputs of row 0 that differ bitwise between `rows_of(m)` and `rows_of(1)` (the result of
    the first m rows of some input, and of its first row alone)."""
    alone = np.asarray(rows_of(1)[0].astype(jnp.float32))
    return int((np.asarray(rows_of(m)[0].astype(jnp.float32)) != alone).sum())


def rounding(product, x: jax.Array, w: jax.Array, m: int) -> int:
    """Outputs of row 0 that differ bitwise between the product of x[:m] and of x[:1]."""
    return row_zero_differs(jax.jit(lambda m: product(x[:m], w), static_argnums=0), m)


def operands(k: int, n: int, m: int) -> tuple[list[jax.Array], list[jax.Array]]:
    keys = jax.random.split(jax.random.key(k * n + m), 2 * COPIES)
    xs = [jax.random.normal(keys[i], (m, k), jnp.bfloat16) for i in range(COPIES)]
    ws = [
        (jax.random.normal(keys[COPIES + i], (k, n)) / np.sqrt(k)).astype(jnp.bfloat16)
        for i in range(COPIES)
    ]
    return xs, ws


def measure(name: str, shape: tuple, ms: list[int], bandwidth: float) -> list[dict]:
    k, n, out_dtype = shape
    rows = []
    for m in ms:
        xs, ws = operands(k, n, m)
        xla_us, xla_compile = time_product(xla_product(out_dtype), xs, ws)
        ours_us, ours_compile = time_product(fixed_product(out_dtype), xs, ws)
        weight_bytes = k * n * 2
        rows.append(
            dict(
                shape=name,
                k=k,
                n=n,
                m=m,
                splits=plan(k, n, MatmulTuning()).num_splits,
                xla_us=xla_us,
                ours_us=ours_us,
                xla_over_ours=xla_us / ours_us,
                ours_bandwidth=weight_bytes / (ours_us * 1e-6) / bandwidth,
                xla_differ=rounding(xla_product(out_dtype), xs[0], ws[0], m) if m > 1 else 0,
                ours_differ=rounding(fixed_product(out_dtype), xs[0], ws[0], m) if m > 1 else 0,
                compile_s=xla_compile + ours_compile,
            )
        )
        print(json.dumps(rows[-1]), flush=True)
    return rows


def sweep(name: str, shape: tuple, ms: list[int]) -> list[dict]:
    k, n, out_dtype = shape
    rows = []
    for m in ms:
        xs, ws = operands(k, n, m)
        for label, knobs in SWEEP.items():
            tuning = dataclasses.replace(MatmulTuning(), **knobs)
            us, _ = time_product(fixed_product(out_dtype, tuning), xs, ws)
            rows.append(dict(shape=name, m=m, tuning=label, us=us))
            print(json.dumps(rows[-1]), flush=True)
    return rows


def by_size(name: str) -> tuple[int, int, jnp.dtype]:
    """A weight named "KxN": (K, N, bf16 out)."""
    k, n = (int(v) for v in name.split("x"))
    return k, n, jnp.bfloat16


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", default=",".join(SHAPES), help="names, or KxN (bf16)")
    parser.add_argument("--ms", default="1,2,16,64,256,1280,8192")
    parser.add_argument("--bandwidth", type=float, default=3.35e12, help="bytes/s for the %%")
    parser.add_argument("--tunings", choices=["default", "sweep"], default="default")
    parser.add_argument("--sweep-ms", default="2,16,64,8192", help="M of the --tunings sweep")
    args = parser.parse_args(argv)
    shapes = {name: SHAPES.get(name) or by_size(name) for name in args.shapes.split(",")}
    ms = [int(m) for m in args.ms.split(",")]
    print(f"device={jax.devices()[0].device_kind}", flush=True)
    result = dict(
        rows=[row for item in shapes.items() for row in measure(*item, ms, args.bandwidth)]
    )
    if args.tunings == "sweep":
        sweep_ms = [int(m) for m in args.sweep_ms.split(",")]
        result["sweep"] = [row for item in shapes.items() for row in sweep(*item, sweep_ms)]
    print("shape      K     N      M     S  XLA us  ours us  XLA/ours  ours %bw  differ XLA/ours")
    for r in result["rows"]:
        print(
            f"{r['shape']:10s} {r['k']:5d} {r['n']:6d} {r['m']:5d} {r['splits']:2d} "
            f"{r['xla_us']:7.1f} {r['ours_us']:8.1f} {r['xla_over_ours']:8.2f}x "
            f"{r['ours_bandwidth']:8.0%}  {r['xla_differ']:6d} / {r['ours_differ']}"
        )
    print(f"compile {sum(r['compile_s'] for r in result['rows']):.0f} s (apart from the times)")
    for r in result.get("sweep", []):
        print(f"sweep {r['shape']:10s} M={r['m']:<5d} {r['tuning']:18s} {r['us']:8.1f} us")
    if os.environ.get("OUT"):
        with open(os.path.join(os.environ["OUT"], "bench_matmul.json"), "w") as f:
            json.dump(result, f, indent=1)
    return result
