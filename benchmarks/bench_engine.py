"""Decode throughput, step time, memory roofline and host time of the serving engine.

Two random bench models (bf16 weights, fp32 recurrent state), each with a `tiny` CPU twin:

* `1b`: NemotronH-shaped, ~0.87B parameters: 11 Mamba2 + 11 relu2 MLP layers, two attention
  layers, hidden 2048;
* `qwen3next`: Qwen3-Next-shaped and sized to fit one H100: 12 layers (9 Gated DeltaNet + 3 gated
  attention, each followed by a 512-expert MoE with 10 routed experts and a shared expert), the
  per-layer shapes of Qwen3-Next-80B-A3B (hidden 2048, 16/32 key/value heads of 128, head dim
  256), ~20B parameters.

B requests of 16-token prompts are served; after one prefill step every step is a pure decode of
B rows. Per batch size we report the step time (wall time of `Engine.step()`), decode tokens/s,
host time per step (schedule + build + postprocess) beside device time (the compiled step call
including input packing, dispatch and the token fetch), and the memory roofline: bytes the step
must move (weights it reads, B recurrent states read and written, KV read) over the bandwidth
measured in the same run. MoE weights count the experts B tokens are expected to touch under
uniform routing (the random router is close to uniform), E * (1 - (1 - k / E)^B) of E.

`--contexts 8192,32768` adds decode at long contexts: the compiled decode step called with its
inputs moved to C tokens of context (each row given its own C / block_size KV blocks; no prefill
is run, the KV pool holds zeros), device time only (host time does not depend on the context).

    python benchmarks/bench_engine.py --size tiny --batches 1,4 --contexts 64   # CPU smoke test
    python benchmarks/bench_engine.py --size 1b --contexts 8192,32768           # GPU
    python benchmarks/bench_engine.py --size qwen3next --contexts 8192,32768    # GPU
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import time

import jax
import numpy as np
from flax import nnx

from jmamba import HybridLM
from jmamba.families import from_hf_config
from jmamba.weights import cast
from runtime.core.builder import StepBatch
from runtime.core.config import EngineConfig
from runtime.core.sampling_params import SamplingParams
from runtime.device.model_runner import ModelRunner
from runtime.engine import Engine

PROMPT_LEN = 16
SIZES = ("tiny", "1b", "qwen3next_tiny", "qwen3next")
MAX_POSITIONS = 65536
_MAMBA, _MLP, _ATTN = "mamba", "mlp", "attention"
_GDN, _FULL = "linear_attention", "full_attention"


def hf_config(size: str) -> dict:
    """config.json of a bench model (see the module docstring)."""
    if size.startswith("qwen3next"):
        return _qwen3_next_config(tiny=size.endswith("tiny"))
    if size == "tiny":
        dims = dict(
            hidden_size=64,
            vocab_size=256,
            mamba_num_heads=8,
            mamba_head_dim=16,
            ssm_state_size=16,
            n_groups=2,
            chunk_size=16,
            intermediate_size=128,
            num_attention_heads=4,
            num_key_value_heads=2,
            head_dim=16,
        )
        pattern = [_MAMBA, _MLP, _ATTN, _MLP]
    else:
        dims = dict(
            hidden_size=2048,
            vocab_size=32000,
            mamba_num_heads=64,
            mamba_head_dim=64,
            ssm_state_size=128,
            n_groups=8,
            chunk_size=128,
            intermediate_size=8192,
            num_attention_heads=16,
            num_key_value_heads=4,
            head_dim=128,
        )
        pattern = [_MAMBA, _MLP] * 5 + [_ATTN, _MLP] + [_MAMBA, _MLP] * 5 + [_ATTN, _MLP]
        pattern = pattern[:22] + [_MAMBA, _MLP]
    return dict(
        architectures=["NemotronHForCausalLM"],
        layers_block_type=pattern,
        conv_kernel=4,
        max_position_embeddings=MAX_POSITIONS,
        tie_word_embeddings=False,
        **dims,
    )


def _qwen3_next_config(tiny: bool) -> dict:
    """Qwen3-Next-80B-A3B's per-layer shapes on 12 layers (tiny: the same structure, small)."""
    if tiny:
        dims = dict(
            hidden_size=64,
            vocab_size=256,
            linear_num_key_heads=2,
            linear_num_value_heads=4,
            linear_key_head_dim=16,
            linear_value_head_dim=16,
            num_attention_heads=4,
            num_key_value_heads=2,
            head_dim=16,
            num_experts=8,
            num_experts_per_tok=2,
            moe_intermediate_size=32,
            shared_expert_intermediate_size=32,
        )
        layers = [_GDN, _GDN, _GDN, _FULL]
    else:
        dims = dict(
            hidden_size=2048,
            vocab_size=151936,
            linear_num_key_heads=16,
            linear_num_value_heads=32,
            linear_key_head_dim=128,
            linear_value_head_dim=128,
            num_attention_heads=16,
            num_key_value_heads=2,
            head_dim=256,
            num_experts=512,
            num_experts_per_tok=10,
            moe_intermediate_size=512,
            shared_expert_intermediate_size=512,
        )
        layers = [_GDN, _GDN, _GDN, _FULL] * 3
    return dict(
        architectures=["Qwen3NextForCausalLM"],
        layer_types=layers,
        num_hidden_layers=len(layers),
        linear_conv_kernel_dim=4,
        intermediate_size=5120,
        decoder_sparse_step=1,
        mlp_only_layers=[],
        norm_topk_prob=True,
        hidden_act="silu",
        rms_norm_eps=1e-6,
        max_position_embeddings=MAX_POSITIONS,
        rope_parameters=dict(rope_type="default", rope_theta=10000.0, partial_rotary_factor=0.25),
        tie_word_embeddings=False,
        **dims,
    )


def build_model(size: str) -> HybridLM:
    """The random bench model in bf16 (`jmamba.weights.cast`), initialised inside one jitted call so
    the fp32 initial values of a 20B model never all exist at once."""
    config = from_hf_config(hf_config(size))
    make = lambda: cast(HybridLM(config, rngs=nnx.Rngs(0)), "bfloat16")  # noqa: E731
    graphdef, _ = nnx.split(nnx.eval_shape(make))
    state = jax.jit(lambda: nnx.split(make())[1])()
    return nnx.merge(graphdef, state)


def measure_bandwidth(num_bytes: int = 1 << 30, repeats: int = 20) -> float:
    """Bytes/s of device memory: `repeats` calls of one jitted bf16 negation over a donated
    `num_bytes` buffer (each reads and writes every byte in place), queued back to back and synced
    once, so dispatch hides behind the ~0.7 ms passes. The pass negates: the earlier probes
    scaled by 1.0001, which is 1.0 in bf16, so XLA removed the pass (41 and 34 TB/s)."""
    donate = (0,) if jax.default_backend() == "gpu" else ()  # CPU cannot donate (it warns)
    scale = jax.jit(jax.numpy.negative, donate_argnums=donate)
    x = scale(jax.numpy.ones(num_bytes // 2, jax.numpy.bfloat16))
    x.block_until_ready()
    start = time.perf_counter()
    for _ in range(repeats):
        x = scale(x)
    x.block_until_ready()
    return 2 * num_bytes * repeats / (time.perf_counter() - start)


def weight_bytes(model: HybridLM, batch: int) -> int:
    """Weight bytes a decode step of `batch` tokens reads: every parameter but the embedding (a
    gather of B rows), MoE expert stacks scaled by the expected fraction of experts touched."""
    moe, total = model.config.moe, 0
    for path, leaf in nnx.to_flat_state(nnx.state(model, nnx.Param)):
        value = leaf.get_value()
        if path == ("embed",):
            continue
        if moe is not None and value.ndim == 3 and value.shape[0] == moe.num_experts:
            touched = 1 - (1 - moe.top_k / moe.num_experts) ** batch
            total += int(value.nbytes * touched)  # [E, ...] stack of routed experts
        else:
            total += value.nbytes
    return total


def step_bytes(model: HybridLM, engine: Engine, batch: int, context: int) -> dict[str, int]:
    """Bytes one decode step must move: weights, B states read + written, KV of B contexts."""
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
    return {"weights": weight_bytes(model, batch), "state": state, "kv": kv}


def make_engine(
    model: HybridLM,
    batch: int,
    steps: int,
    max_model_len: int = 256,
    budget: int | None = None,
    async_scheduling: bool = False,
    runner: ModelRunner | None = None,
) -> Engine:
    """A warmed-up engine holding `batch` requests of PROMPT_LEN random tokens (not yet stepped),
    prefilled `budget` tokens a step (default: all prompts in one step); `runner`: another such
    engine's runner (its compiled steps)."""
    least = model.config.chunk_size + batch - 1
    budget = max(budget or batch * PROMPT_LEN, least)
    config = EngineConfig(
        max_num_seqs=batch,
        max_num_batched_tokens=budget,
        max_model_len=max_model_len,
        block_size=16,
        decode_row_buckets=(max(batch, 2),),  # the default's smallest is 2
        prefill_token_buckets=(budget,),
        prefill_row_buckets=(batch,),
        async_scheduling=async_scheduling,
    )
    engine = Engine(model, config, runner=runner)
    engine.warmup()
    rng = np.random.default_rng(0)
    for _ in range(batch):
        prompt = rng.integers(0, model.config.vocab_size, PROMPT_LEN).tolist()
        engine.add_request(prompt, SamplingParams(max_tokens=4 * steps + 64))
    return engine


def time_steps(engine: Engine, steps: int) -> tuple[float, float, float]:
    """(wall, host, device) seconds per `Engine.step()` over `steps` decode steps, after the
    prefill step and three warm decode steps."""
    for _ in range(4):
        engine.step()
    host0, device0 = engine.stats.host_seconds, engine.stats.device_seconds
    start = time.perf_counter()
    for _ in range(steps):
        engine.step()
    step_s = (time.perf_counter() - start) / steps
    return (
        step_s,
        (engine.stats.host_seconds - host0) / steps,
        (engine.stats.device_seconds - device0) / steps,
    )


def bench_batch(model: HybridLM, batch: int, steps: int, bandwidth: float) -> dict:
    """The synchronous engine's step (host, device, roofline), then the asynchronous engine's
    step time on the same compiled steps (`async_step_ms`; its device time is only the wait for
    the previous step's tokens, so its host/device split is not comparable)."""
    engine = make_engine(model, batch, steps)
    step_s, host_s, device_s = time_steps(engine, steps)
    moved = step_bytes(model, engine, batch, PROMPT_LEN + 4 + steps // 2)
    roofline_s = sum(moved.values()) / bandwidth
    compile_s = engine.runner.compile_seconds
    overlapped = make_engine(model, batch, steps, async_scheduling=True, runner=engine.runner)
    async_step_s, _, _ = time_steps(overlapped, steps)
    return dict(
        batch=batch,
        step_ms=1e3 * step_s,
        tokens_per_s=batch / step_s,
        host_ms=1e3 * host_s,
        device_ms=1e3 * device_s,
        host_pct=100 * host_s / step_s,
        roofline_ms=1e3 * roofline_s,
        x_roofline=device_s / roofline_s,
        async_step_ms=1e3 * async_step_s,
        async_tokens_per_s=batch / async_step_s,
        bytes=moved,
        variants=engine.num_variants,
        compile_s={str(b): round(t, 1) for b, t in compile_s.items()},
    )


def at_context(batch_in: StepBatch, context: int, block_size: int) -> StepBatch:
    """A pure-decode batch (one lane per row) moved to `context` tokens of context: live row r
    decodes position `context` and owns blocks 1 + r * n ... (r + 1) * n, n = the blocks of
    context + 1 tokens (distinct per row, never NULL)."""
    inputs = batch_in.inputs
    decode = inputs.decode
    if decode.width != 1 or inputs.num_prefill_tokens:
        raise ValueError("at_context takes a pure-decode batch of one lane per row")
    live = np.asarray(decode.query_lens) > 0
    n = -(-(context + 1) // block_size)
    rows = np.arange(decode.num_rows)
    table = np.zeros_like(np.asarray(decode.block_table))
    table[:, :n] = np.where(live[:, None], 1 + rows[:, None] * n + np.arange(n)[None, :], 0)
    positions = np.where(live, context, 0).astype(np.int32)
    kv_slots = table[rows, context // block_size] * block_size + context % block_size
    new_decode = dataclasses.replace(
        decode, seq_lens=np.where(live, context + 1, 0).astype(np.int32), block_table=table
    )
    new_inputs = dataclasses.replace(
        inputs,
        decode=new_decode,
        positions=_with_head(inputs.positions, positions),
        kv_slots=_with_head(inputs.kv_slots, np.where(live, kv_slots, 0).astype(np.int32)),
    )
    return dataclasses.replace(batch_in, inputs=new_inputs)


def _with_head(array: np.ndarray, head: np.ndarray) -> np.ndarray:
    out = np.array(array)
    out[: len(head)] = head
    return out


def bench_context(
    model: HybridLM, batch: int, context: int, steps: int, bandwidth: float, budget: int = 256
) -> dict:
    """Device ms of the compiled decode step at `context` tokens of context (pipelined calls)."""
    # Prefill `budget` tokens a step: the ragged jnp prefill attention gathers each token's
    # max_model_len window (4096 tokens at 8k would need 34 GB; 256 at 32k on the Qwen3-Next
    # shape, head dim 256, asked for 24.6 GiB).
    engine = make_engine(model, batch, steps, context + 4 * PROMPT_LEN, budget=budget)
    engine.step()
    while engine.inspect.last_batch.inputs.num_prefill_tokens:  # until a pure-decode step has run
        engine.step()
    runner, bucket = engine.runner, engine.last_bucket
    moved = at_context(engine.inspect.last_batch, context, engine.config.block_size)
    packed = runner.device_inputs(bucket, [moved])
    for _ in range(3):
        step = runner.dispatch(bucket, [moved], packed)
    np.asarray(step.tokens)
    start = time.perf_counter()
    for _ in range(steps):
        step = runner.dispatch(bucket, [moved], packed)
    np.asarray(step.tokens)
    device_s = (time.perf_counter() - start) / steps
    moved_bytes = step_bytes(model, engine, batch, context)
    roofline_s = sum(moved_bytes.values()) / bandwidth
    return dict(
        batch=batch,
        context=context,
        device_ms=1e3 * device_s,
        roofline_ms=1e3 * roofline_s,
        x_roofline=device_s / roofline_s,
        bytes=moved_bytes,
    )


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--size", choices=SIZES, default="1b")
    parser.add_argument("--batches", default="1,16,64,256")
    parser.add_argument("--contexts", default="", help="long-context decode, e.g. 8192,32768")
    parser.add_argument(
        "--max-context-tokens",
        type=int,
        default=1 << 21,
        help="skip long-context rows with batch x context above this",
    )
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument(
        "--context-budget",
        type=int,
        default=256,
        help="prefill tokens a step before a long-context row",
    )
    args = parser.parse_args()
    model = build_model(args.size)
    num_params = sum(x.size for x in jax.tree.leaves(nnx.state(model, nnx.Param)))
    bandwidth = measure_bandwidth(1 << (30 if jax.default_backend() == "gpu" else 24))
    print(
        f"device={jax.devices()[0].device_kind} model={args.size} "
        f"params={num_params / 1e9:.3f}B bandwidth={bandwidth / 1e9:.0f} GB/s",
        flush=True,
    )
    batches = [int(b) for b in args.batches.split(",")]
    rows = []
    for batch in batches:
        rows.append(bench_batch(model, batch, args.steps, bandwidth))
        print(json.dumps(rows[-1]), flush=True)
    long_rows = []
    for context in (int(c) for c in args.contexts.split(",") if c):
        for batch in (b for b in batches if b * context <= args.max_context_tokens):
            long_rows.append(
                bench_context(model, batch, context, args.steps, bandwidth, args.context_budget)
            )
            print(json.dumps(long_rows[-1]), flush=True)
    if os.environ.get("OUT"):
        with open(os.path.join(os.environ["OUT"], f"bench_engine_{args.size}.json"), "w") as f:
            json.dump(
                {
                    "params": num_params,
                    "bandwidth": bandwidth,
                    "rows": rows,
                    "long_context": long_rows,
                },
                f,
                indent=1,
            )
    print_tables(rows, long_rows)


def print_tables(rows: list[dict], long_rows: list[dict]) -> None:
    print(
        "batch  step_ms  tok/s     host_ms device_ms host%  roofline_ms  dev/roofline  "
        "async_step_ms"
    )
    for r in rows:
        print(
            f"{r['batch']:5d} {r['step_ms']:8.3f} {r['tokens_per_s']:9.0f} {r['host_ms']:8.3f} "
            f"{r['device_ms']:8.3f} {r['host_pct']:6.1f} {r['roofline_ms']:10.3f} "
            f"{r['x_roofline']:8.2f} {r['async_step_ms']:13.3f}"
        )
    if long_rows:
        print("batch  context  device_ms  roofline_ms  dev/roofline")
        for r in long_rows:
            print(
                f"{r['batch']:5d} {r['context']:8d} {r['device_ms']:9.3f} "
                f"{r['roofline_ms']:11.3f} {r['x_roofline']:8.2f}"
            )


if __name__ == "__main__":
    main()
