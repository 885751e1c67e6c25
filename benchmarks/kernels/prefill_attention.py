"""Paged prefill attention: the Pallas kernel vs the jnp gather path and torch's fused attention.

One prompt of L tokens whose keys sit in blocks scattered over the pool (block size 16), causal,
at two layer shapes: Qwen3-Next's gated attention (16 query / 2 KV heads of 256) and
Nemotron-H-47B's (64 / 8 of 128), bf16. Timed as many calls inside one jitted loop (dispatch
excluded), median of 5 repeats, after a check against the reference where the reference fits
(its gather is [L, L, Hkv, D] fp32). The anchor is torch's `scaled_dot_product_attention`
(is_causal, bf16, CUDA events) on contiguous K / V: what a kernel with no paging reaches, an
upper bound for ours, not a like-for-like paged kernel. Roofline = causal FLOPs
(2 x 2 x L^2 / 2 x Hq x D) at the bf16 dense peak given by --peak-tflops (H100 SXM datasheet:
989).

    python -m benchmarks.kernels prefill_attention --lengths 64,200 --calls 2   # CPU smoke
    python -m benchmarks.kernels prefill_attention                              # GPU
    python -m benchmarks.kernels prefill_attention --tunings 32:64:4:2,64:32:8:3   # and these knobs
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import time

import jax
import jax.numpy as jnp
import numpy as np

from benchmarks.harness.timing import time_calls_in_loop
from pallas_kernels.attention.prefill import paged_prefill_attention
from pallas_kernels.attention.reference import paged_attention_reference

SHAPES = {"qwen3next": (16, 2, 256), "nemotronh47b": (64, 8, 128)}  # Hq, Hkv, D
BLOCK = 16
REFERENCE_BYTES = 8 << 30  # the gather path runs only below this
TUNING_KNOBS = ("block_m", "block_k", "num_warps", "num_stages")


def make_inputs(rng, length: int, heads: int, kv_heads: int, head_dim: int):
    blocks = -(-length // BLOCK)
    table = (1 + rng.permutation(blocks)).reshape(1, blocks).astype(np.int32)
    kv = (blocks + 1, BLOCK, kv_heads, head_dim)
    q = jnp.asarray(rng.standard_normal((length, heads, head_dim)), jnp.bfloat16)
    k = jnp.asarray(rng.standard_normal(kv), jnp.bfloat16)
    v = jnp.asarray(rng.standard_normal(kv), jnp.bfloat16)
    rows, positions = np.zeros(length, np.int32), np.arange(length, dtype=np.int32)
    return (q, k, v, table, rows, positions, np.ones(length, bool))


def contiguous(inputs) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """q, k, v [L, H, D] as float32 numpy, the keys read back through the block table."""
    q, k, v = (np.asarray(a, np.float32) for a in inputs[:3])
    table = inputs[3]
    length = q.shape[0]
    keys = k[table[0]].reshape(-1, *k.shape[2:])[:length]
    values = v[table[0]].reshape(-1, *v.shape[2:])[:length]
    return q, keys, values


def torch_time(inputs, scale: float, calls: int) -> float:
    """Seconds per call of torch's fused causal attention on the same q, k, v (GQA expanded)."""
    import torch

    q, k, v = (torch.tensor(a, dtype=torch.bfloat16, device="cuda") for a in contiguous(inputs))
    group = q.shape[1] // k.shape[1]
    q, k, v = (t.transpose(0, 1)[None] for t in (q, k, v))  # [1, H, L, D]
    k, v = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)

    def call():
        return torch.nn.functional.scaled_dot_product_attention(
            q, k, v, is_causal=True, scale=scale
        )

    call()
    times = []
    for _ in range(5):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(calls):
            call()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end) / 1e3 / calls)
    return float(np.median(times))


def bench(shape: str, length: int, calls: int, peak: float, on_gpu: bool, tunings) -> dict:
    heads, kv_heads, head_dim = SHAPES[shape]
    inputs = make_inputs(np.random.default_rng(length), length, heads, kv_heads, head_dim)
    scale = head_dim**-0.5
    kernel = functools.partial(paged_prefill_attention, scale=scale, interpret=not on_gpu)
    tuned = {
        name: functools.partial(
            kernel, **dict(zip(TUNING_KNOBS, map(int, name.split(":")), strict=True))
        )
        for name in tunings
    }
    reference = functools.partial(paged_attention_reference, scale=scale)
    start = time.perf_counter()
    out = np.asarray(jax.jit(kernel)(*inputs), np.float32)
    compile_s = time.perf_counter() - start
    row = dict(shape=shape, length=length, compile_s=compile_s)
    if length * length * kv_heads * head_dim * 8 < REFERENCE_BYTES:
        ref = np.asarray(jax.jit(reference)(*inputs), np.float32)
        row["rel_err"] = float(np.linalg.norm(out - ref) / np.linalg.norm(ref))
        row["jnp_us"] = 1e6 * time_calls_in_loop(reference, inputs, max(1, calls // 4))
    row["ours_us"] = 1e6 * time_calls_in_loop(kernel, inputs, calls)
    row["tunings_us"] = {
        name: 1e6 * time_calls_in_loop(fn, inputs, calls) for name, fn in tuned.items()
    }
    flops = 2 * 2 * length * length / 2 * heads * head_dim
    row["roofline_us"] = 1e6 * flops / (peak * 1e12)
    row["pct_roofline"] = 100 * row["roofline_us"] / row["ours_us"]
    if on_gpu:
        row["torch_us"] = 1e6 * torch_time(inputs, scale, calls)
        row["torch_over_ours"] = row["torch_us"] / row["ours_us"]
    return row


def main(argv: list[str] | None = None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shapes", default="qwen3next,nemotronh47b")
    parser.add_argument("--lengths", default="1024,4096,8192,32768")
    parser.add_argument("--calls", type=int, default=10)
    parser.add_argument("--peak-tflops", type=float, default=989.0)
    parser.add_argument(
        "--tunings", default="", help="also time these block_m:block_k:num_warps:num_stages"
    )
    args = parser.parse_args(argv)
    on_gpu = jax.default_backend() == "gpu"
    print(f"device={jax.devices()[0].device_kind}", flush=True)
    rows = []
    for shape in args.shapes.split(","):
        for length in (int(n) for n in args.lengths.split(",")):
            tunings = [t for t in args.tunings.split(",") if t]
            rows.append(bench(shape, length, args.calls, args.peak_tflops, on_gpu, tunings))
            print(json.dumps(rows[-1]), flush=True)
    if os.environ.get("OUT"):
        with open(os.path.join(os.environ["OUT"], "bench_prefill_attention.json"), "w") as f:
            json.dump(rows, f, indent=1)
    return rows
