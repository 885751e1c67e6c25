"""Why a draft equal to the target is not always accepted in bf16: does a row's product depend on
how many rows the GEMM has?

A decode step with drafts feeds each row 1 + K lanes, so every projection of the step is a GEMM
of M = rows x (1 + K) tokens instead of M = rows. If the GPU's GEMM rounds a row differently at
another M (another tile shape, split-K, another algorithm picked per shape), a lane's bf16 logits
differ from the one-lane step's, and a greedy tie can break the other way.

For M in `--ms`, row 0 of `x[:M] @ W` (bf16 operands, bf16 product as `jmamba.layers.linear.Linear`
emits it; and fp32 for comparison) against row 0 at M = 1: how many of its N outputs differ, and
by how much at most. Shapes: the 0.87B bench model's projections (hidden 2048; 8192 the MLP's).

    python benchmarks/probe_lane_rounding.py            # one GPU, seconds
    XLA_FLAGS=--xla_gpu_autotune_level=0 python benchmarks/probe_lane_rounding.py
"""

from __future__ import annotations

import argparse
import json
import os

import jax
import jax.numpy as jnp
import numpy as np

SHAPES = ((2048, 8192), (8192, 2048), (2048, 2048))


def row_zero(x: jax.Array, w: jax.Array, m: int, dtype: jnp.dtype) -> np.ndarray:
    product = jax.jit(
        lambda a, b: jnp.dot(a, b, preferred_element_type=dtype, precision="highest")
    )(x[:m], w)
    return np.asarray(product[0].astype(jnp.float32))


def probe(k: int, n: int, ms: list[int], dtype: jnp.dtype) -> list[dict]:
    keys = jax.random.split(jax.random.key(0), 2)
    x = (jax.random.normal(keys[0], (max(ms), k)) / np.sqrt(k)).astype(dtype)
    w = jax.random.normal(keys[1], (k, n)).astype(dtype)
    reference = row_zero(x, w, 1, dtype)
    rows = []
    for m in ms:
        got = row_zero(x, w, m, dtype)
        rows.append(
            dict(
                k=k,
                n=n,
                m=m,
                dtype=jnp.dtype(dtype).name,
                differ=int((got != reference).sum()),
                max_abs=float(np.abs(got - reference).max()),
            )
        )
    return rows


def main(argv: list[str] | None = None) -> list[dict]:
    parser = argparse.ArgumentParser()
    parser.add_argument("--ms", default="1,2,4,5,8,16,32,64,128,256")
    args = parser.parse_args(argv)
    ms = [int(m) for m in args.ms.split(",")]
    print(f"device={jax.devices()[0].device_kind} XLA_FLAGS={os.environ.get('XLA_FLAGS', '')}")
    rows = [
        row
        for k, n in SHAPES
        for dtype in (jnp.bfloat16, jnp.float32)
        for row in probe(k, n, ms, dtype)
    ]
    print("K     N     dtype     " + " ".join(f"M={m:<5d}" for m in ms))
    for k, n in SHAPES:
        for dtype in ("bfloat16", "float32"):
            cells = [r for r in rows if (r["k"], r["n"], r["dtype"]) == (k, n, dtype)]
            line = " ".join(f"{r['differ']:<7d}" for r in cells)
            print(f"{k:<5d} {n:<5d} {dtype:9s} {line}")
    print("cells: how many of row 0's N outputs differ from the M = 1 product")
    if os.environ.get("OUT"):
        with open(os.path.join(os.environ["OUT"], "probe_lane_rounding.json"), "w") as f:
            json.dump(rows, f, indent=1)
    return rows


if __name__ == "__main__":
    main()
