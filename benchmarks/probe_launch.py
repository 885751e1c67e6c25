"""Does a Pallas (Triton) kernel break XLA's command buffers (CUDA graphs)? A launch-cost probe.

One jitted function runs a chain of N tiny dependent kernels on a [1024] fp32 vector, built three
ways: XLA fusions only (kept apart by optimization barriers), Pallas kernels only, and the two
alternating (the shape of our decode step: fusions and GEMMs between Pallas calls). For each:
the time until the call returns (the host's launch cost) and the time per call of calls queued
back to back (the GPU's, when launches keep ahead of it). With XLA_FLAGS unset XLA's command
buffers apply; run it again with `--xla_gpu_enable_command_buffer=` to see them off, or pass
XLA options per compilation (as `runtime.device.model_runner` does) with `--option name=value`.

With `--donate` the vector is donated, so every call's output lands where its input was: the
buffers the command buffer reads and writes keep their addresses. Without it each call's output is
a fresh buffer and XLA re-records the command buffer before launching it (its log says
`Updated command buffer`). `--extras N` gives every kernel N more [16] arguments (kernels of our
step take up to ~20), to see whether a graph's launch cost grows with its kernels' arguments.

    PYTHONPATH=. python benchmarks/probe_launch.py [--kernels 100] [--donate] [--extras N]
        [--option NAME=VALUE]
"""

from __future__ import annotations

import argparse
import json
import os
import time

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plgpu

SIZE = 1024


def _pallas_step(x: jax.Array, extras: tuple[jax.Array, ...] = ()) -> jax.Array:
    """x * 0.5 + 1 plus the first entry of each of `extras` (more kernel arguments)."""

    def kernel(x_ref, *refs):
        *extra_refs, o_ref = refs
        out = x_ref[...] * 0.5 + 1.0
        for ref in extra_refs:
            out = out + ref[0]
        o_ref[...] = out

    return pl.pallas_call(
        kernel,
        out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
        compiler_params=plgpu.CompilerParams(num_warps=4, num_stages=1),
        interpret=jax.default_backend() == "cpu",
    )(x, *extras)


def _xla_step(x: jax.Array, extras: tuple[jax.Array, ...] = ()) -> jax.Array:
    return jax.lax.optimization_barrier(x * 0.5 + 1.0 + sum(e[0] for e in extras))


def chain(kind: str, n: int, options: dict[str, str], donate: bool = False, extras: int = 0):
    """The chain, compiled (with `options` as XLA compiler options) for a [SIZE] fp32 vector
    and `extras` [16] fp32 arguments that every kernel also reads."""
    steps = {"xla": [_xla_step], "pallas": [_pallas_step], "mixed": [_xla_step, _pallas_step]}
    pattern = steps[kind]

    def run(x, more):
        for i in range(n):
            x = pattern[i % len(pattern)](x, more)
        return x

    x = jax.ShapeDtypeStruct((SIZE,), jnp.float32)
    more = tuple(jax.ShapeDtypeStruct((16,), jnp.float32) for _ in range(extras))
    jitted = jax.jit(run, donate_argnums=0 if donate else ())
    return jitted.lower(x, more).compile(compiler_options=options or None)


def measure(
    kind: str,
    n: int,
    options: dict[str, str],
    calls: int = 50,
    donate: bool = False,
    extras: int = 0,
) -> dict:
    fn = chain(kind, n, options, donate, extras)
    more = tuple(jnp.full((16,), 1e-6 * i, jnp.float32) for i in range(extras))
    x = jax.block_until_ready(fn(jnp.ones(SIZE, jnp.float32), more))
    returns, t_all = 0.0, time.perf_counter()
    for _ in range(calls):
        t0 = time.perf_counter()
        x = fn(x, more)
        returns += time.perf_counter() - t0
    jax.block_until_ready(x)
    queued = (time.perf_counter() - t_all) / calls
    return {
        "kind": kind,
        "kernels": n,
        "returns_us": 1e6 * returns / calls,
        "queued_us_per_call": 1e6 * queued,
        "us_per_kernel": 1e6 * queued / n,
        "xla_flags": os.environ.get("XLA_FLAGS", ""),
        "options": options,
        "donate": donate,
        "extras": extras,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--kernels", type=int, default=100)
    ap.add_argument("--calls", type=int, default=50)
    ap.add_argument("--option", action="append", default=[], metavar="NAME=VALUE")
    ap.add_argument("--donate", action="store_true", help="donate the vector (stable addresses)")
    ap.add_argument("--extras", type=int, default=0, help="extra arguments every kernel reads")
    args = ap.parse_args()
    options = dict(o.split("=", 1) for o in args.option)
    for kind in ("xla", "pallas", "mixed"):
        row = measure(kind, args.kernels, options, args.calls, args.donate, args.extras)
        print("PROBE " + json.dumps(row), flush=True)


if __name__ == "__main__":
    main()
