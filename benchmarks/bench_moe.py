"""The routed-expert matmul of a MoE layer at decode sizes, three ways, beside the memory roofline.

Qwen3-Next's expert shapes (512 experts, hidden 2048, expert width 512, 10 routed per token): B
tokens route to B * 10 (token, expert) pairs, sorted by expert. Timed, in one process per XLA_FLAGS
variant (flags are read when the backend starts):

* `ragged_dot`: `jax.lax.ragged_dot` over the sorted pairs (what `jmamba.layers.moe` calls);
* `gather`: each pair's expert matrix gathered, then a batched matvec (reads B * 10 matrices);
* roofline: the bytes of the experts the pairs touch (plus activations) / bandwidth.

Variants: XLA's default lowering and its two experimental ragged-dot paths. Prints us per call
(50 calls queued back to back, synced once) and the max |difference| from the gather result.

    python benchmarks/bench_moe.py --batches 1,4 --experts 8 --hidden 64 --width 32   # CPU smoke
    python benchmarks/bench_moe.py                                                     # GPU
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

VARIANTS = {
    "default": "",
    "ragged_fusion": "--xla_gpu_experimental_use_ragged_dot_fusion=true",
    "grouped_gemm": "--xla_gpu_experimental_use_ragged_dot_grouped_gemm=true",
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


def run(args: argparse.Namespace, name: str) -> list[dict]:
    import jax
    import jax.numpy as jnp
    import numpy as np

    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    from benchmarks.bench_engine import measure_bandwidth

    bandwidth = measure_bandwidth(1 << (30 if jax.default_backend() == "gpu" else 24))
    e, h, i, k = args.experts, args.hidden, args.width, args.top_k
    w = jax.random.normal(jax.random.key(0), (e, h, i), jnp.bfloat16) / h**0.5
    ragged = jax.jit(
        lambda x, w, sizes: jax.lax.ragged_dot(x, w, sizes, preferred_element_type=jnp.float32)
    )
    gather = jax.jit(lambda x, w, ids: jnp.einsum("th,thi->ti", x, w[ids]))
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
        touched = len(np.unique(np.asarray(ids)))
        moved = touched * h * i * 2 + len(ids) * (h + i) * 2
        row["roofline_us"] = 1e6 * moved / bandwidth
        print(json.dumps(row), flush=True)
        rows.append(row)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--batches", default="1,16,64,256")
    parser.add_argument("--experts", type=int, default=512)
    parser.add_argument("--hidden", type=int, default=2048)
    parser.add_argument("--width", type=int, default=512)
    parser.add_argument("--top-k", type=int, default=10)
    parser.add_argument("--variants", default=",".join(VARIANTS))
    parser.add_argument("--child", default=None)
    args = parser.parse_args()
    if args.child:
        run(args, args.child)
        return
    for name in args.variants.split(","):
        flags = (os.environ.get("XLA_FLAGS", "") + " " + VARIANTS[name]).strip()
        argv = [f"--{key.replace('_', '-')}={value}" for key, value in vars(args).items()
                if key not in ("variants", "child")]  # fmt: skip
        print(f"== {name}: XLA_FLAGS={flags!r}", flush=True)
        subprocess.run([sys.executable, __file__, *argv, "--child", name],
                       env=dict(os.environ, XLA_FLAGS=flags), check=False)  # fmt: skip


if __name__ == "__main__":
    main()
