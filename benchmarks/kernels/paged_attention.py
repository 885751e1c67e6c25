"""Paged decode attention: the Pallas kernel vs the jnp gather path, against the memory roofline.

Shape of the bench model's attention layers (16 query heads, 4 KV heads, head dim 128, bf16 KV,
block size 16). For each batch B and context C every row holds C tokens in blocks scattered over the
pool; one decode lane per row. Roofline = the KV bytes the rows own (B x C x 2 x 4 x 128 x 2 bytes)
over the bandwidth measured in the same run (one jitted loop of passes over 1 GiB). The jnp path
(`paged_decode_attention_reference`) gathers max_blocks x block_size keys per query, so its table is
sized to the context (max_model_len = C) to be fair to it. Both are timed as many calls inside one
jitted loop (dispatch excluded), median of 5 repeats; the kernel's output is checked against the
reference first.

    python -m benchmarks.kernels paged_attention --batches 1,4 --contexts 64,256   # CPU smoke
    python -m benchmarks.kernels paged_attention                                    # GPU
"""

from __future__ import annotations

import argparse
import functools
import json
import os

import jax
import jax.numpy as jnp
import numpy as np

from benchmarks.harness.roofline import measure_bandwidth
from benchmarks.harness.timing import time_calls_in_loop
from pallas_kernels.attention.decode import paged_decode_attention
from pallas_kernels.attention.reference import paged_decode_attention_reference

HEADS, KV_HEADS, HEAD_DIM, BLOCK = 16, 4, 128, 16


def make_inputs(rng, batch: int, context: int):
    blocks = -(-context // BLOCK)
    num_blocks = batch * blocks + 1
    table = (1 + rng.permutation(batch * blocks)).reshape(batch, blocks).astype(np.int32)
    kv = (num_blocks, BLOCK, KV_HEADS, HEAD_DIM)
    q = jnp.asarray(rng.standard_normal((batch, 1, HEADS, HEAD_DIM)), jnp.bfloat16)
    k = jnp.asarray(rng.standard_normal(kv), jnp.bfloat16)
    v = jnp.asarray(rng.standard_normal(kv), jnp.bfloat16)
    seq = np.full(batch, context, np.int32)
    return q, k, v, jnp.asarray(table), jnp.asarray(seq), jnp.asarray(np.ones(batch, np.int32))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", default="1,16,64")
    parser.add_argument("--contexts", default="1024,8192,32768")
    parser.add_argument("--calls", type=int, default=20)
    args = parser.parse_args(argv)
    on_gpu = jax.default_backend() == "gpu"
    bandwidth = measure_bandwidth()
    print(f"device={jax.devices()[0].device_kind} bandwidth={bandwidth / 1e9:.0f} GB/s", flush=True)
    scale = HEAD_DIM**-0.5
    kernel = functools.partial(paged_decode_attention, scale=scale, interpret=not on_gpu)
    reference = functools.partial(paged_decode_attention_reference, scale=scale)
    rng, rows = np.random.default_rng(0), []
    for context in (int(c) for c in args.contexts.split(",")):
        for batch in (int(b) for b in args.batches.split(",")):
            inputs = make_inputs(rng, batch, context)
            out = np.asarray(jax.jit(kernel)(*inputs), np.float32)
            ref = np.asarray(jax.jit(reference)(*inputs), np.float32)
            err = float(np.linalg.norm(out - ref) / np.linalg.norm(ref))
            kv_bytes = batch * context * 2 * KV_HEADS * HEAD_DIM * 2
            ours = time_calls_in_loop(kernel, inputs, args.calls)
            try:
                jnp_path = time_calls_in_loop(reference, inputs, max(1, args.calls // 4))
            except Exception as error:  # noqa: BLE001 - the gather path can run out of memory
                jnp_path = float("nan")
                print(f"jnp path failed at B={batch} C={context}: {type(error).__name__}")
            row = dict(
                batch=batch,
                context=context,
                ours_us=ours * 1e6,
                jnp_us=jnp_path * 1e6,
                speedup=jnp_path / ours,
                roofline_us=kv_bytes / bandwidth * 1e6,
                pct_roofline=100 * kv_bytes / bandwidth / ours,
                rel_err=err,
            )
            rows.append(row)
            print(json.dumps(row), flush=True)
    if os.environ.get("OUT"):
        with open(os.path.join(os.environ["OUT"], "bench_paged_attention.json"), "w") as f:
            json.dump(dict(bandwidth=bandwidth, rows=rows), f, indent=1)
    print("batch context   ours_us    jnp_us  jnp/ours  roofline_us  %roofline  rel_err")
    for r in rows:
        print(
            f"{r['batch']:5d} {r['context']:7d} {r['ours_us']:9.1f} {r['jnp_us']:9.1f} "
            f"{r['speedup']:8.2f} {r['roofline_us']:11.1f} {r['pct_roofline']:9.0f} "
            f"{r['rel_err']:8.1e}"
        )
