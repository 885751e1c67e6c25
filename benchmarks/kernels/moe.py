"""The routed-expert matmul of a MoE layer at decode sizes, four ways, beside the memory roofline.

Qwen3-Next's expert shapes (512 experts, hidden 2048, expert width 512, 10 routed per token): B
tokens route to B * 10 (token, expert) pairs, sorted by expert. Timed, in one process per XLA_FLAGS
variant (flags are read when the backend starts):

* `ragged_dot`: `jax.lax.ragged_dot` over the sorted pairs (what `jmamba.layers.moe` calls);
* `gather`: each pair's expert matrix gathered, then a batched matvec (reads B * 10 matrices);
* `pallas`: `ops.grouped_matmul` (the Pallas kernel `jmamba.layers.moe` calls on the GPU; interpret
  mode on a CPU), and with `--tunings` the kernel under other launch knobs (`TUNINGS`);
* `fp8`: `ops.fp8_grouped_matmul` on the experts quantized to e4m3 in 128 x 128 blocks (an FP8
  checkpoint's layout, what `jmamba.layers.fp8_experts` calls on the GPU), its difference taken
  from the gather of the dequantized experts;
* roofline: the bytes of the experts the pairs touch (plus activations) / bandwidth; `fp8_roofline`
  the same with 1-byte experts and their scales.

Variants: XLA's default lowering and its two experimental ragged-dot paths. Prints us per call
(50 calls queued back to back, synced once) and the max |difference| from the gather result.

    python -m benchmarks.kernels moe --batches 1,4 --experts 8 --hidden 64 --width 32 \\
        --top-k 2                                                        # CPU smoke
    python -m benchmarks.kernels moe                                     # GPU
    python -m benchmarks.kernels moe --variants default --tunings all    # GPU tuning
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import subprocess
import time

from benchmarks.harness.suite import bench_command, repo_on_path

VARIANTS = {
    "default": "",
    "ragged_fusion": "--xla_gpu_experimental_use_ragged_dot_fusion=true",
    "grouped_gemm": "--xla_gpu_experimental_use_ragged_dot_grouped_gemm=true",
}


# Launch knobs of the Pallas kernel timed with --tunings (names become `<name>_us` columns).
TUNINGS = {
    "n32": dict(block_n=32),  # twice the programs per expert: more SMs busy at B = 1
    "k128_s3": dict(block_k=128, num_stages=3),  # the first default (101 us at B = 1)
    "k256_s2": dict(block_k=256, num_stages=2),
    "m32": dict(block_m=32),  # fewer weight re-reads for groups of > 16 pairs (B >= 256)
    "m64_w8": dict(block_m=64, num_warps=8),
}


def time_calls(fn, *args, repeats: int = 50) -> float:
    """Seconds per call of `fn(*args)`, calls queued back to back."""
    out = fn(*args)
    out.block_until_ready()
    start = time.perf_counter()
    for _ in range(repeats):
        out = fn(*args)
    out.block_until_ready()
    return (time.perf_counter() - start) / repeats


def pallas_calls(tunings: str, interpret: bool) -> dict:
    """Column name -> jitted (x, w, group_sizes) -> out: `ops.grouped_matmul` as the model calls
    it, then the kernel under each tuning named in `tunings` ("all", or names from TUNINGS)."""
    import jax

    from pallas_kernels import ops
    from pallas_kernels.moe.grouped_matmul import GroupedMatmulTuning, grouped_matmul

    dispatch = functools.partial(
        ops.grouped_matmul, implementation="interpret" if interpret else "pallas"
    )
    calls = {"pallas": jax.jit(dispatch)}
    for name in TUNINGS if tunings == "all" else filter(None, tunings.split(",")):
        tuning = GroupedMatmulTuning(**TUNINGS[name])
        calls[name] = jax.jit(functools.partial(grouped_matmul, tuning=tuning, interpret=interpret))
    return calls


FP8_BLOCK = (128, 128)  # rows along K (hidden), columns along N (the expert width)


def fp8_experts(w):
    """(e4m3 entries [E, K, N], fp32 scales [E, G_k, G_n], the fp32 values they stand for) of
    the stack `w` in blocks of `FP8_BLOCK` (amax / 448 a block, blocks cut short at the edges)."""
    import jax.numpy as jnp

    from pallas_kernels.moe.fp8_reference import dequantize_experts

    e, k, n = w.shape
    bk, bn = min(FP8_BLOCK[0], k), min(FP8_BLOCK[1], n)
    gk, gn = -(-k // bk), -(-n // bn)
    padded = jnp.pad(w.astype(jnp.float32), ((0, 0), (0, gk * bk - k), (0, gn * bn - n)))
    amax = jnp.abs(padded.reshape(e, gk, bk, gn, bn)).max(axis=(2, 4))
    scale = jnp.maximum(amax / 448.0, jnp.finfo(jnp.float32).tiny)
    full = jnp.repeat(jnp.repeat(scale, bk, 1), bn, 2)[:, :k, :n]
    entries = jnp.clip(w.astype(jnp.float32) / full, -448.0, 448.0).astype(jnp.float8_e4m3fn)
    return entries, scale, dequantize_experts(entries, scale, (bk, bn))


def run(args: argparse.Namespace, name: str) -> list[dict]:
    import jax
    import jax.numpy as jnp
    import numpy as np

    from benchmarks.harness.roofline import measure_bandwidth
    from pallas_kernels import ops

    bandwidth = measure_bandwidth()
    e, h, i, k = args.experts, args.hidden, args.width, args.top_k
    w = jax.random.normal(jax.random.key(0), (e, h, i), jnp.bfloat16) / h**0.5
    ragged = jax.jit(
        lambda x, w, sizes: jax.lax.ragged_dot(x, w, sizes, preferred_element_type=jnp.float32)
    )
    gather = jax.jit(lambda x, w, ids: jnp.einsum("th,thi->ti", x, w[ids]))
    interpret = jax.default_backend() != "gpu"
    pallas = pallas_calls(args.tunings, interpret=interpret)
    w8, scale, w8_values = fp8_experts(w)
    block = (min(FP8_BLOCK[0], h), min(FP8_BLOCK[1], i))
    fp8 = jax.jit(
        functools.partial(
            ops.fp8_grouped_matmul,
            block=block,
            implementation="interpret" if interpret else "pallas",
        )
    )
    rows = []
    for batch in (int(b) for b in args.batches.split(",")):
        rng = np.random.default_rng(batch)
        ids = np.sort(np.concatenate([rng.choice(e, k, replace=False) for _ in range(batch)]))
        sizes = jnp.asarray(np.bincount(ids, minlength=e).astype(np.int32))
        x = jax.random.normal(jax.random.key(batch), (len(ids), h), jnp.bfloat16)
        ids = jnp.asarray(ids.astype(np.int32))
        row = {"variant": name, "batch": batch, "pairs": len(ids)}
        try:
            row["ragged_us"] = 1e6 * time_calls(ragged, x, w, sizes)
            diff = ragged(x, w, sizes).astype(jnp.float32) - gather(x, w, ids).astype(jnp.float32)
            row["max_abs_diff"] = float(jnp.max(jnp.abs(diff)))
        except Exception as error:  # an out-of-memory lowering is a result too
            row["ragged_error"] = repr(error)[:200]
        row["gather_us"] = 1e6 * time_calls(gather, x, w, ids)
        reference = gather(x, w, ids).astype(jnp.float32)
        for column, fn in pallas.items():
            row[f"{column}_us"] = 1e6 * time_calls(fn, x, w, sizes)
            row[f"{column}_max_abs_diff"] = float(jnp.max(jnp.abs(fn(x, w, sizes) - reference)))
        row["fp8_us"] = 1e6 * time_calls(fp8, x, w8, scale, sizes)
        exact = gather(x.astype(jnp.float32), w8_values, ids)
        row["fp8_max_abs_diff"] = float(jnp.max(jnp.abs(fp8(x, w8, scale, sizes) - exact)))
        touched = len(np.unique(np.asarray(ids)))
        activations = len(ids) * (h + i) * 2
        moved = touched * h * i * 2 + activations
        row["roofline_us"] = 1e6 * moved / bandwidth
        fp8_moved = touched * (h * i + scale[0].size * 4) + activations
        row["fp8_roofline_us"] = 1e6 * fp8_moved / bandwidth
        print(json.dumps(row), flush=True)
        rows.append(row)
    return rows


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", default="1,16,64,256")
    parser.add_argument("--experts", type=int, default=512)
    parser.add_argument("--hidden", type=int, default=2048)
    parser.add_argument("--width", type=int, default=512)
    parser.add_argument("--top-k", type=int, default=10)
    parser.add_argument("--variants", default=",".join(VARIANTS))
    parser.add_argument("--tunings", default="", help=f"all or some of {','.join(TUNINGS)}")
    parser.add_argument("--child", default=None)
    args = parser.parse_args(argv)
    if args.child:
        run(args, args.child)
        return
    for name in args.variants.split(","):
        flags = (os.environ.get("XLA_FLAGS", "") + " " + VARIANTS[name]).strip()
        child_argv = [
            f"--{key.replace('_', '-')}={value}"
            for key, value in vars(args).items()
            if key not in ("variants", "child")
        ]
        print(f"== {name}: XLA_FLAGS={flags!r}", flush=True)
        subprocess.run(
            bench_command("benchmarks.kernels", "moe", *child_argv, "--child", name),
            env=repo_on_path(dict(os.environ, XLA_FLAGS=flags)),
            check=False,
        )
