"""`Fp8Linear`'s GPU path (`fp8_product`: activations quantized per token or per 1 x 128 group at
run time, e4m3 dot_generals accumulated in fp32, then scaled) beside the bf16 product the model
runs without FP8 (`jnp.dot`, cuBLAS on the GPU).

For each weight K x N and rows M: microseconds per product (a jitted program of 8 products over 4
weight copies, queued 20 times, the median of 5 runs: `benchmarks.kernels.matmul.time_product`)
for per-channel FP8 weights ("fp8 ch", per-token activations), 128 x 128 block weights ("fp8 blk",
one GEMM per 1 x 128 activation group) and bf16; the ratio bf16 / FP8 (above 1: FP8 is faster);
and each product's max error relative to the largest output of the fp32 product of the same
weights (the bf16 one of the bf16-rounded weights). The kernel is [in, out] as `Fp8Linear` holds
it: if XLA transposes it for cuBLAS's FP8 GEMM (which takes K-major operands), the time shows it.

    python -m benchmarks.kernels fp8_linear                          # the H100
    python -m benchmarks.kernels fp8_linear --ms 1,3 --shapes 256x128  # CPU smoke
"""

from __future__ import annotations

import argparse
import json
import os

import jax
import jax.numpy as jnp
import numpy as np

from benchmarks.kernels.matmul import COPIES, time_product
from jmamba.layers.fp8_linear import dequantized_kernel, fp8_product, scale_shape

SHAPES = "2048x2048,2048x8192,8192x2048"
FORMS = {"fp8_ch": (0, 1), "fp8_blk": (128, 128)}  # Fp8Linear blocks (along in, out)


def quantized(w: jax.Array, block: tuple[int, int]) -> tuple[jax.Array, jax.Array]:
    """w [K, N] fp32 as e4m3 entries and fp32 scales, amax / 448 per block."""
    k, n = w.shape
    rows, cols = scale_shape(k, n, block)
    side_k, side_n = block[0] or k, block[1] or n
    padded = jnp.pad(w, ((0, rows * side_k - k), (0, cols * side_n - n)))
    tiles = jnp.abs(padded).reshape(rows, side_k, cols, side_n).max(axis=(1, 3))
    scale = jnp.maximum(tiles / 448.0, jnp.finfo(jnp.float32).tiny)
    expanded = jnp.repeat(jnp.repeat(scale, side_k, 0), side_n, 1)[:k, :n]
    return (w / expanded).clip(-448, 448).astype(jnp.float8_e4m3fn), scale


def max_rel_err(ours: jax.Array, exact: jax.Array) -> float:
    exact = np.asarray(exact, np.float32)
    return float(np.abs(np.asarray(ours, np.float32) - exact).max() / np.abs(exact).max())


def measure(k: int, n: int, m: int) -> dict:
    keys = jax.random.split(jax.random.key(k * n + m), 2 * COPIES)
    xs = [jax.random.normal(keys[i], (m, k), jnp.bfloat16) for i in range(COPIES)]
    ws = [jax.random.normal(keys[COPIES + i], (k, n)) / np.sqrt(k) for i in range(COPIES)]
    bf16 = [w.astype(jnp.bfloat16) for w in ws]
    dot = lambda x, w: jnp.dot(x, w, preferred_element_type=jnp.bfloat16)  # noqa: E731
    exact = lambda x, w: jnp.dot(  # noqa: E731
        x.astype(jnp.float32), w, precision=jax.lax.Precision.HIGHEST
    )
    bf16_us, _ = time_product(dot, xs, bf16)
    row = dict(
        k=k,
        n=n,
        m=m,
        bf16_us=bf16_us,
        bf16_err=max_rel_err(dot(xs[0], bf16[0]), exact(xs[0], ws[0])),
    )
    for form, block in FORMS.items():
        weights = [quantized(w, block) for w in ws]
        product = lambda x, w, b=block: fp8_product(x, w[0], w[1], b, jnp.bfloat16)  # noqa: E731
        us, _ = time_product(product, xs, weights)
        kernel, scale = weights[0]
        reference = exact(xs[0], dequantized_kernel(kernel, scale, block))
        row |= {
            f"{form}_us": us,
            f"{form}_ratio": bf16_us / us,
            f"{form}_err": max_rel_err(product(xs[0], weights[0]), exact(xs[0], ws[0])),
            f"{form}_err_vs_dequant": max_rel_err(product(xs[0], weights[0]), reference),
        }
    print(json.dumps(row), flush=True)
    return row


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", default=SHAPES, help="KxN weights, comma separated")
    parser.add_argument("--ms", default="1,16,64,256,8192")
    args = parser.parse_args(argv)
    shapes = [tuple(int(v) for v in s.split("x")) for s in args.shapes.split(",")]
    ms = [int(m) for m in args.ms.split(",")]
    print(f"device={jax.devices()[0].device_kind}", flush=True)
    result = dict(device=jax.devices()[0].device_kind)
    result["rows"] = [measure(k, n, m) for k, n in shapes for m in ms]
    print("    K     N     M  bf16 us  fp8ch us  ratio  fp8blk us  ratio   err bf16 / ch / blk")
    for r in result["rows"]:
        print(
            f"{r['k']:5d} {r['n']:5d} {r['m']:5d} {r['bf16_us']:8.1f} {r['fp8_ch_us']:9.1f} "
            f"{r['fp8_ch_ratio']:5.2f}x {r['fp8_blk_us']:10.1f} {r['fp8_blk_ratio']:5.2f}x  "
            f"{r['bf16_err']:.1e} / {r['fp8_ch_err']:.1e} / {r['fp8_blk_err']:.1e}"
        )
    if os.environ.get("OUT"):
        with open(os.path.join(os.environ["OUT"], "bench_fp8_linear.json"), "w") as f:
            json.dump(result, f, indent=1)
    return result
