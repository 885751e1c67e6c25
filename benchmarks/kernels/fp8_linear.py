"""`Fp8Linear`'s GPU products beside the bf16 product the model runs without FP8 (`jnp.dot`,
cuBLAS on the GPU), per channel ("ch": block (0, 1)) and in 128 x 128 blocks ("blk"):

- "w8a8" (`fp8_product`): activations quantized per token or per 1 x 128 group at run time,
  e4m3 dot_generals accumulated in fp32, then scaled;
- "wo" (`pallas_kernels.ops.fp8_weight_matmul`, the default "weight_only"): bf16 activations
  times the e4m3 weight read as stored, converted in registers, scaled in the fp32 accumulator;
- "xla" (`xla_weight_only_product`): `dot(x, w_e4m3.astype(bf16)) * column scales` left to XLA,
  whose GEMM fusion may convert the weight as it loads it (blocks: the kernel dequantized first).

For each weight K x N and rows M: microseconds per product (a jitted program of 8 products over 4
weight copies, queued 20 times, the median of 5 runs: `benchmarks.kernels.matmul.time_product`)
and the ratio bf16 / form (above 1: the form is faster); the share of the memory roofline (the
weight's bytes, 1 an entry plus its fp32 scales for FP8 and 2 for bf16, plus the bf16 activations
in and out, over the time, against `--bandwidth`, the H100's 3.35 TB/s); each product's max error
relative to the largest output of the fp32 product of the weights it holds (bf16: the unrounded
weights; FP8: the dequantized ones, so the error is the product's own, "qerr" adding the
weight's quantization); and how many outputs of row 0 of "wo" differ bitwise from the same row
computed alone (0: batch invariant). The kernel is [in, out] as `Fp8Linear` holds it. Shapes:
2048 x 2048 and the 0.87B bench model's dense projections (MLP up / down, Mamba in / out).
On the GPU a (shape, M) should take about a minute (the last run: ~7 s a product, mostly its
compile); `--forms` names fewer forms.
`--tunings sweep` also times "wo" under other launch knobs (`SWEEP`) at `--sweep-ms`, and counts
the outputs whose bits differ from the default tuning's.

    python -m benchmarks.kernels fp8_linear --shapes 2048x8192        # the H100, a shape a call
    python -m benchmarks.kernels fp8_linear --shapes 8192x2048 --ms 1 --tunings sweep
    python -m benchmarks.kernels fp8_linear --ms 1,3 --shapes 256x128  # CPU smoke (interpreted)
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os

import jax
import jax.numpy as jnp
import numpy as np

from benchmarks.kernels.matmul import COPIES, row_zero_differs, time_product
from jmamba.layers.fp8_linear import fp8_product, scale_shape, xla_weight_only_product
from pallas_kernels.matmul.fp8_reference import dequantize
from pallas_kernels.matmul.fp8_weights import FP8_TUNING, fp8_weight_matmul

SHAPES = "2048x2048,2048x8192,8192x2048,2048x10304,4096x2048"
BLOCKS = {"ch": (0, 1), "blk": (128, 128)}  # Fp8Linear blocks (along in, out)
FORMS = [f"{p}_{b}" for p in ("w8a8", "wo", "xla") for b in BLOCKS]
SWEEP = {  # MatmulTuning fields over FP8_TUNING's
    "default": {},
    "n128": dict(block_n=128),
    "n32_w2": dict(block_n=32, num_warps=2),
    "k64_s5": dict(block_k=64, num_stages=5),
    "s3": dict(num_stages=3),
    "m32": dict(block_m=32),
    "m64": dict(block_m=64, num_stages=3),
    "m64_n128": dict(block_m=64, block_n=128, num_stages=3),
    "m128_n128_w8": dict(block_m=128, block_n=128, block_k=64, num_warps=8, num_stages=3),
    "p256": dict(min_programs=256),
}


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
    want = np.asarray(exact, np.float32)
    return float(np.abs(np.asarray(ours, np.float32) - want).max() / np.abs(want).max())


def kernel_product(block, tuning=FP8_TUNING, out_dtype=jnp.bfloat16):
    """Ours, interpreted off the GPU (the CPU smoke run)."""
    interpret = jax.default_backend() != "gpu"
    return lambda x, w: fp8_weight_matmul(
        x, *w, block=block, out_dtype=out_dtype, tuning=tuning, interpret=interpret
    )


def product_of(form: str):
    kind, block = form.split("_")[0], BLOCKS[form.split("_")[1]]
    if kind == "wo":
        return kernel_product(block)
    fn = fp8_product if kind == "w8a8" else xla_weight_only_product
    return lambda x, w: fn(x, w[0], w[1], block, jnp.bfloat16)


def exact(x: jax.Array, w: jax.Array) -> jax.Array:
    return jnp.dot(x.astype(jnp.float32), w, precision=jax.lax.Precision.HIGHEST)


def operands(k: int, n: int, m: int) -> tuple[list[jax.Array], list[jax.Array]]:
    keys = jax.random.split(jax.random.key(k * n + m), 2 * COPIES)
    xs = [jax.random.normal(keys[i], (m, k), jnp.bfloat16) for i in range(COPIES)]
    ws = [jax.random.normal(keys[COPIES + i], (k, n)) / np.sqrt(k) for i in range(COPIES)]
    return xs, ws


def roofline(weight_bytes: float, k: int, n: int, m: int, us: float, bandwidth: float) -> float:
    """The bytes a product must move (weight, bf16 rows in and out) over its time, / bandwidth."""
    return (weight_bytes + 2 * m * (k + n)) / (us * 1e-6) / bandwidth


def form_columns(form: str, xs, ws, held, bf16_us: float, bandwidth: float) -> dict:
    """One FP8 form's columns: its time, ratio, roofline share and errors."""
    (m, k), n = xs[0].shape, ws[0].shape[1]
    product = product_of(form)
    us, _ = time_product(product, xs, held)
    out = product(xs[0], held[0])
    kernel, scale = held[0]
    dequantized = dequantize(kernel, scale, BLOCKS[form.split("_")[1]])
    return {
        f"{form}_us": us,
        f"{form}_ratio": bf16_us / us,
        f"{form}_roofline": roofline(k * n + 4 * scale.size, k, n, m, us, bandwidth),
        f"{form}_err": max_rel_err(out, exact(xs[0], dequantized)),
        f"{form}_qerr": max_rel_err(out, exact(xs[0], ws[0])),
    }


def kernel_differs(x: jax.Array, weight: tuple[jax.Array, jax.Array], m: int) -> int:
    """Outputs of row 0 of "wo_ch" that differ bitwise between x[:m] and x[:1]."""
    product = product_of("wo_ch")
    return row_zero_differs(jax.jit(lambda m: product(x[:m], weight), static_argnums=0), m)


def measure(k: int, n: int, m: int, bandwidth: float, forms: list[str]) -> dict:
    xs, ws = operands(k, n, m)
    bf16 = [w.astype(jnp.bfloat16) for w in ws]
    dot = lambda x, w: jnp.dot(x, w, preferred_element_type=jnp.bfloat16)  # noqa: E731
    bf16_us, _ = time_product(dot, xs, bf16)
    row = dict(
        k=k,
        n=n,
        m=m,
        bf16_us=bf16_us,
        bf16_roofline=roofline(2 * k * n, k, n, m, bf16_us, bandwidth),
        bf16_err=max_rel_err(dot(xs[0], bf16[0]), exact(xs[0], ws[0])),
    )
    weights = {name: [quantized(w, block) for w in ws] for name, block in BLOCKS.items()}
    for form in forms:
        row |= form_columns(form, xs, ws, weights[form.split("_")[1]], bf16_us, bandwidth)
    if m > 1 and "wo_ch" in forms:
        row["wo_differ"] = kernel_differs(xs[0], weights["ch"][0], m)
    print(json.dumps(row), flush=True)
    return row


def sweep(k: int, n: int, ms: list[int]) -> list[dict]:
    """ "wo" under each of `SWEEP`'s tunings beside bf16, both blocks; "differ": how many fp32
    outputs of the M rows differ bitwise from FP8_TUNING's (0: a row's bits do not depend on
    the tuning, e.g. on block_m, and so could not on a choice of it)."""
    rows = []
    for m in ms:
        xs, ws = operands(k, n, m)
        dot = lambda x, w: jnp.dot(x, w, preferred_element_type=jnp.bfloat16)  # noqa: E731
        bf16_us, _ = time_product(dot, xs, [w.astype(jnp.bfloat16) for w in ws])
        for block_name, block in BLOCKS.items():
            held = [quantized(w, block) for w in ws]
            base = np.asarray(kernel_product(block, out_dtype=jnp.float32)(xs[0], held[0]))
            for label, knobs in SWEEP.items():
                tuning = dataclasses.replace(FP8_TUNING, **knobs)
                us, _ = time_product(kernel_product(block, tuning), xs, held)
                out = np.asarray(kernel_product(block, tuning, jnp.float32)(xs[0], held[0]))
                rows.append(dict(k=k, n=n, m=m, block=block_name, tuning=label, us=us))
                rows[-1] |= dict(ratio=bf16_us / us, differ=int((out != base).sum()))
                print(json.dumps(rows[-1]), flush=True)
    return rows


def _cells(r: dict, forms: list[str], key: str, fmt: str) -> str:
    return " ".join(fmt.format(r[f"{form}_{key}"]) for form in forms)


def report(result: dict) -> None:
    forms = result["forms"]
    heads = " ".join(f"{form:>14s}" for form in forms)
    print(f"us (bf16 / form)          K     N     M  {'bf16':>8s} {heads}")
    for r in result["rows"]:
        cells = " ".join(f"{r[f'{f}_us']:7.1f} {r[f'{f}_ratio']:5.2f}x" for f in forms)
        print(f"{'':24s}{r['k']:5d} {r['n']:5d} {r['m']:5d} {r['bf16_us']:8.1f} {cells}")
    heads = " ".join(f"{form:>8s}" for form in forms)
    print(f"% roofline / err / qerr   K     N     M  {'bf16':>5s} {heads}   wo differ")
    for r in result["rows"]:
        shape = f"{r['k']:5d} {r['n']:5d} {r['m']:5d}"
        roofline_cells = _cells(r, forms, "roofline", "{:8.0%}")
        print(f"{'roofline':24s}{shape} {r['bf16_roofline']:5.0%} {roofline_cells}")
        differ = r.get("wo_differ", "-")
        err_cells = _cells(r, forms, "err", "{:8.1e}")
        print(f"{'err':24s}{shape} {r['bf16_err']:.0e} {err_cells}   {differ}")
        print(f"{'qerr':24s}{shape} {'':5s} {_cells(r, forms, 'qerr', '{:8.1e}')}")
    for r in result.get("sweep", []):
        print(
            f"sweep {r['k']}x{r['n']} M={r['m']:<5d} {r['block']:3s} {r['tuning']:14s} "
            f"{r['us']:8.1f} us {r['ratio']:5.2f}x bf16, {r['differ']} outputs differ"
        )


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", default=SHAPES, help="KxN weights, comma separated")
    parser.add_argument("--ms", default="1,16,64,256,8192")
    parser.add_argument("--forms", default=",".join(FORMS), help="FP8 forms beside bf16")
    parser.add_argument("--bandwidth", type=float, default=3.35e12, help="bytes/s for the %%")
    parser.add_argument("--tunings", choices=["default", "sweep"], default="default")
    parser.add_argument("--sweep-ms", default="16,256", help="M of the --tunings sweep")
    args = parser.parse_args(argv)
    shapes = [tuple(int(v) for v in s.split("x")) for s in args.shapes.split(",")]
    ms = [int(m) for m in args.ms.split(",")]
    print(f"device={jax.devices()[0].device_kind}", flush=True)
    forms = [form for form in args.forms.split(",") if form]
    if unknown := set(forms) - set(FORMS):
        parser.error(f"--forms: unknown {sorted(unknown)}; the forms: {FORMS}")
    result: dict = dict(device=jax.devices()[0].device_kind, forms=forms)
    result["rows"] = [measure(k, n, m, args.bandwidth, forms) for k, n in shapes for m in ms]
    if args.tunings == "sweep":
        sweep_ms = [int(m) for m in args.sweep_ms.split(",")]
        result["sweep"] = [row for k, n in shapes for row in sweep(k, n, sweep_ms)]
    report(result)
    if os.environ.get("OUT"):
        with open(os.path.join(os.environ["OUT"], "bench_fp8_linear.json"), "w") as f:
            json.dump(result, f, indent=1)
    return result
