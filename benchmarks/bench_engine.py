"""Decode throughput, step time, memory roofline and host time of the serving engine.

A random NemotronH-shaped hybrid model (~1B parameters: Mamba2 + relu2 MLP layers, two attention
layers, bf16 weights, fp32 SSM state) serves B requests of 16-token prompts; after one prefill
step every step is a pure decode of B rows. Per batch size we report the step time (wall time of
`Engine.step()`), decode tokens/s, host time per step (schedule + build + postprocess) beside
device time (the compiled step call including input packing, dispatch and the token fetch), and
the memory roofline: bytes the step must move (weights + B recurrent states read and written + KV
read) over the bandwidth measured in the same run.

    python benchmarks/bench_engine.py --size tiny --batches 1,4     # CPU smoke test
    python benchmarks/bench_engine.py --size 1b                     # GPU
"""

from __future__ import annotations

import argparse
import json
import os
import time

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from jmamba import HybridLM
from jmamba.families import from_hf_config
from runtime.config import EngineConfig
from runtime.engine import Engine
from runtime.sampling_params import SamplingParams

PROMPT_LEN = 16
_MAMBA, _MLP, _ATTN = "mamba", "mlp", "attention"


def hf_config(size: str) -> dict:
    """NemotronH-style config.json: 1b = 24 layers (11 Mamba2, 11 MLP, 2 attention), hidden 2048."""
    if size == "tiny":
        dims = dict(hidden_size=64, vocab_size=256, mamba_num_heads=8, mamba_head_dim=16,
                    ssm_state_size=16, n_groups=2, chunk_size=16, intermediate_size=128,
                    num_attention_heads=4, num_key_value_heads=2, head_dim=16)  # fmt: skip
        pattern = [_MAMBA, _MLP, _ATTN, _MLP]
    else:
        dims = dict(hidden_size=2048, vocab_size=32000, mamba_num_heads=64, mamba_head_dim=64,
                    ssm_state_size=128, n_groups=8, chunk_size=128, intermediate_size=8192,
                    num_attention_heads=16, num_key_value_heads=4, head_dim=128)  # fmt: skip
        pattern = [_MAMBA, _MLP] * 5 + [_ATTN, _MLP] + [_MAMBA, _MLP] * 5 + [_ATTN, _MLP]
        pattern = pattern[:22] + [_MAMBA, _MLP]
    return dict(architectures=["NemotronHForCausalLM"], layers_block_type=pattern, conv_kernel=4,
                max_position_embeddings=4096, tie_word_embeddings=False, **dims)  # fmt: skip


def build_model(size: str) -> HybridLM:
    model = HybridLM(from_hf_config(hf_config(size)), rngs=nnx.Rngs(0))
    graphdef, state = nnx.split(model)
    to_bf16 = lambda x: x.astype(jnp.bfloat16) if jnp.issubdtype(x.dtype, jnp.floating) else x  # noqa: E731
    return nnx.merge(graphdef, jax.tree.map(to_bf16, state))


def measure_bandwidth(num_bytes: int = 1 << 30, repeats: int = 20) -> float:
    """Bytes/s of device memory: `repeats` passes of a bf16 scale over `num_bytes`, each reading and
    writing every byte, inside ONE jitted loop (no per-call dispatch or allocation in the timing;
    the 20 separately dispatched calls of the earlier probe read 303 GB/s on an H100). The barrier
    keeps XLA from unrolling the loop and fusing the passes into one (that read 41 TB/s)."""
    x = jnp.ones(num_bytes // 2, jnp.bfloat16)

    def one_pass(_, b):
        return jax.lax.optimization_barrier(b * 1.0001)

    passes = jax.jit(lambda a: jax.lax.fori_loop(0, repeats, one_pass, a))
    passes(x).block_until_ready()
    start = time.perf_counter()
    passes(x).block_until_ready()
    return 2 * num_bytes * repeats / (time.perf_counter() - start)


def step_bytes(model: HybridLM, engine: Engine, batch: int, context: int) -> dict[str, int]:
    """Bytes one decode step must move: weights, B states read + written, KV of B contexts."""
    params = nnx.state(model, nnx.Param)
    weights = sum(x.nbytes for x in jax.tree.leaves(params)) - model.embed[...].nbytes
    state = kv = 0
    for cache in engine.runner.caches:
        if cache is None:
            continue
        for leaf in jax.tree.leaves(cache):
            per_entry = leaf.nbytes // leaf.shape[0]
            if type(cache).__name__ == "KVCache":  # [blocks, block_size, heads, dim]
                kv += per_entry // leaf.shape[1] * batch * (context + 1)
            else:  # [slots, ...]: read and write each live slot
                state += 2 * per_entry * batch
    return {"weights": weights, "state": state, "kv": kv}


def make_engine(model: HybridLM, batch: int, steps: int) -> Engine:
    """A warmed-up engine holding `batch` requests of PROMPT_LEN random tokens (not yet stepped)."""
    budget = max(batch * PROMPT_LEN, model.config.chunk_size)
    config = EngineConfig(max_num_seqs=batch, max_num_batched_tokens=budget, max_model_len=256,
                          block_size=16, decode_row_buckets=(batch,),
                          prefill_token_buckets=(budget,),
                          prefill_row_buckets=(batch,))  # fmt: skip
    engine = Engine(model, config)
    engine.warmup()
    rng = np.random.default_rng(0)
    for _ in range(batch):
        prompt = rng.integers(0, model.config.vocab_size, PROMPT_LEN).tolist()
        engine.add_request(prompt, SamplingParams(max_tokens=4 * steps + 64))
    return engine


def bench_batch(model: HybridLM, batch: int, steps: int, bandwidth: float) -> dict:
    engine = make_engine(model, batch, steps)
    for _ in range(4):  # the prefill step, then warm decode steps
        engine.step()
    host0, device0 = engine.stats.host_seconds, engine.stats.device_seconds
    start = time.perf_counter()
    for _ in range(steps):
        engine.step()
    step_s = (time.perf_counter() - start) / steps
    host_s = (engine.stats.host_seconds - host0) / steps
    device_s = (engine.stats.device_seconds - device0) / steps
    moved = step_bytes(model, engine, batch, PROMPT_LEN + 4 + steps // 2)
    roofline_s = sum(moved.values()) / bandwidth
    compile_s = engine.runner.compile_seconds
    return dict(batch=batch, step_ms=1e3 * step_s, tokens_per_s=batch / step_s,
                host_ms=1e3 * host_s, device_ms=1e3 * device_s, host_pct=100 * host_s / device_s,
                roofline_ms=1e3 * roofline_s, x_roofline=step_s / roofline_s,
                bytes=moved, variants=engine.num_variants,
                compile_s={str(b): round(t, 1) for b, t in compile_s.items()})  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--size", choices=["tiny", "1b"], default="1b")
    parser.add_argument("--batches", default="1,16,64,256")
    parser.add_argument("--steps", type=int, default=30)
    args = parser.parse_args()
    model = build_model(args.size)
    num_params = sum(x.size for x in jax.tree.leaves(nnx.state(model, nnx.Param)))
    bandwidth = measure_bandwidth(1 << (30 if args.size == "1b" else 24))
    print(f"device={jax.devices()[0].device_kind} params={num_params / 1e9:.3f}B "
          f"bandwidth={bandwidth / 1e9:.0f} GB/s", flush=True)  # fmt: skip
    rows = []
    for batch in (int(b) for b in args.batches.split(",")):
        rows.append(bench_batch(model, batch, args.steps, bandwidth))
        print(json.dumps(rows[-1]), flush=True)
    if os.environ.get("OUT"):
        with open(os.path.join(os.environ["OUT"], "bench_engine.json"), "w") as f:
            json.dump({"params": num_params, "bandwidth": bandwidth, "rows": rows}, f, indent=1)
    print("batch  step_ms  tok/s     host_ms device_ms host%  roofline_ms  x_roofline")
    for r in rows:
        print(f"{r['batch']:5d} {r['step_ms']:8.3f} {r['tokens_per_s']:9.0f} {r['host_ms']:8.3f} "
              f"{r['device_ms']:8.3f} {r['host_pct']:6.1f} {r['roofline_ms']:10.3f} "
              f"{r['x_roofline']:8.2f}")  # fmt: skip


if __name__ == "__main__":
    main()
