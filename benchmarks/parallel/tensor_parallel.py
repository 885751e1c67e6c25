"""Tensor-parallel decode and prefill of models too large for one GPU, against a per-GPU roofline.

Shapes (random bf16 weights made on each shard, `RandomShards`: no device ever holds the whole
model, the whole model is shapes only):

* `qwen3next80b`: Qwen3-Next-80B-A3B's published shape: 48 layers, 3 Gated DeltaNet : 1 gated
  attention, hidden 2048, 512 experts (10 routed) + a shared expert, moe_intermediate 512,
  16 q / 2 kv heads of 256, GDN 16 key / 32 value heads of 128, vocabulary 151936;
* `nemotronh47b`: Nemotron-H-47B-Base-8K's shape as we read its published config.json (the
  assumption, not checked against the file here): hidden 8192, 98 layers of
  `NEMOTRON_H_47B_PATTERN` (M Mamba2, * attention, - relu2 MLP), Mamba2 256 heads x 64, state
  256, 8 groups, attention 64 q / 8 kv heads of 128, MLP 30720, vocabulary 131072;
* `qwen3next20b`: the 20B bench shape of the engine suite's `decode` (`--size qwen3next`: the
  80B's per-layer shapes on 12 layers).

Per shape and mesh (tp x dp): one runner, its random weights made once, serves every batch of
the sweep (one bucket per batch). Each row: the asynchronous decode step time (median of
`--steps` steps after the prefill and warm-up; the compile seconds apart) against the per-GPU
memory roofline: parameter bytes each GPU reads per step (MoE stacks scaled by the experts a
rank's B / dp tokens touch, `benchmarks.harness.roofline`) + its share of the state and KV bytes +
the all-reduce bytes (two per layer of B / dp x hidden bf16, a ring moving 2 (T - 1) / T of them)
over the link bandwidth measured here with a psum of a known size. `--profile` adds each row's
kernel breakdown (a trace of 5 steps). With dp = 1, the prefill throughput of one `--prefill-len`
prompt on the same weights. `--small` swaps in tiny dims (CPU, fake devices, seconds). Rows are
written to $OUT as they come, so a run cut short keeps what it measured.

    python -m benchmarks.parallel tensor_parallel --shapes qwen3next80b,nemotronh47b \
        --tp 2 --batches 1,16,64,256
    python -m benchmarks.parallel tensor_parallel --shapes qwen3next20b --tp 1,2,4
    python -m benchmarks.parallel tensor_parallel --shapes qwen3next20b --tp 2 --dp 2
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time

import jax
import numpy as np

from benchmarks.harness.models import SharedParams, hf_config, shapes_of
from benchmarks.harness.roofline import measure_bandwidth, weight_bytes
from benchmarks.harness.serving import PROMPT_LEN
from benchmarks.harness.trace import load_trace, profile_events, summarize_profile
from jmamba import HybridLM
from jmamba.checkpoints.families.registry import from_hf_config
from runtime.core.engine_args import EngineArgs
from runtime.core.sampling_params import SamplingParams
from runtime.device.distributed import make_mesh
from runtime.device.memory import resolve_config
from runtime.device.model_runner import ModelRunner
from runtime.device.placement import RandomShards
from runtime.engine import Engine

SHAPES = ("qwen3next80b", "nemotronh47b", "qwen3next20b")
NEMOTRON_H_47B_PATTERN = (
    "M-M-M-M-M-M-M-M-M*-M-M-M-M-M-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M-M-M---MM---M-M*"
    "-M-M-M-M-M-"
)


def shape_config(shape: str, small: bool) -> dict:
    """config.json of a bench shape (`small`: the same layer kinds, tiny dims)."""
    if shape.startswith("qwen3next"):
        config = hf_config("qwen3next_tiny" if small else "qwen3next")
        if shape == "qwen3next80b":
            layers = ["linear_attention"] * 3 + ["full_attention"]
            config["layer_types"] = layers * (1 if small else 12)
            config["num_hidden_layers"] = len(config["layer_types"])
        return config
    if small:
        return hf_config("tiny")
    pattern = {"M": "mamba", "*": "attention", "-": "mlp"}
    return dict(
        architectures=["NemotronHForCausalLM"],
        layers_block_type=[pattern[c] for c in NEMOTRON_H_47B_PATTERN],
        hidden_size=8192,
        vocab_size=131072,
        mamba_num_heads=256,
        mamba_head_dim=64,
        ssm_state_size=256,
        n_groups=8,
        chunk_size=128,
        conv_kernel=4,
        intermediate_size=30720,
        num_attention_heads=64,
        num_key_value_heads=8,
        head_dim=128,
        max_position_embeddings=8192,
        tie_word_embeddings=False,
    )


def model_shapes(shape: str, small: bool) -> HybridLM:
    """The whole model as shapes only, in bf16 (its shards are made on the devices)."""
    return shapes_of(from_hf_config(shape_config(shape, small)))


def link_bandwidth(tp: int, num_bytes: int) -> float:
    """Bytes/s of one device's all-reduce bus: a psum of `num_bytes` bf16 per device over `tp`
    devices, timed after a warm-up call; a ring moves 2 (tp - 1) / tp of the bytes. 0 for tp=1."""
    if tp == 1:
        return 0.0
    mesh = make_mesh(1, tp)
    spec = jax.sharding.PartitionSpec("tp")
    sharding = jax.sharding.NamedSharding(mesh.mesh, spec)
    psum = jax.jit(
        jax.shard_map(
            lambda x: jax.lax.psum(x, "tp"), mesh=mesh.mesh, in_specs=spec, out_specs=spec
        )
    )
    x = jax.device_put(
        np.ones(tp * (num_bytes // 2), np.float32).astype(jax.numpy.bfloat16), sharding
    )
    psum(x).block_until_ready()
    times = []
    for _ in range(5):
        start = time.perf_counter()
        psum(x).block_until_ready()
        times.append(time.perf_counter() - start)
    return 2 * (tp - 1) / tp * num_bytes / statistics.median(times)


def allreduce_bytes(model: HybridLM, batch: int) -> int:
    """Bytes all-reduced per decode step: one all-reduce per mixer and per FFN of B x hidden
    bf16 activations (row-parallel outputs)."""
    cfg = model.config
    reductions = sum(m != "none" for m in cfg.mixers) + sum(f != "none" for f in cfg.ffns)
    return reductions * batch * cfg.hidden_size * 2


def decode_config(model: HybridLM, batches: list[int], tp: int, dp: int) -> EngineArgs:
    """One engine config for every batch of the sweep (per rank: a decode bucket per batch; the
    prompts of every batch prefilled in one step of one bucket), so one runner serves them all."""
    rows = sorted({max(-(-b // dp), 2) for b in batches})  # per rank; decode buckets start at 2
    least = model.config.chunk_size + rows[-1] - 1  # a full chunk beside a full decode batch
    budget = max(least, rows[-1] * PROMPT_LEN)
    return EngineArgs(
        max_num_seqs=rows[-1],
        max_num_batched_tokens=budget,
        max_model_len=256,
        block_size=16,
        decode_row_buckets=tuple(rows),
        prefill_token_buckets=(budget,),  # one prefill variant (its compile is paid once)
        prefill_row_buckets=(rows[-1],),
        async_scheduling=True,
        prefix_caching="off",
        data_parallel_size=dp,
        tensor_parallel_size=tp,
    )


def decode_row(model, runner, label, batch, steps, bandwidth, link, profile_dir) -> dict:
    """One (shape, mesh, batch) row on the shared runner (its decode variants compiled): median
    async step time after the prefill and warm-up steps, the per-GPU roofline."""
    config, tp, dp = runner.config, runner.config.tensor_parallel_size, runner.mesh.size
    engine = Engine(model, EngineArgs.of_config(config), runner=runner)
    rng = np.random.default_rng(batch)
    prompts = [rng.integers(0, model.config.vocab_size, PROMPT_LEN).tolist() for _ in range(batch)]
    ids = [engine.add_request(p, SamplingParams(max_tokens=2 * steps + 16)) for p in prompts]
    for _ in range(4):  # the prefill (compiled by the first row), warm decode steps
        engine.step()
    times = []
    for _ in range(steps):
        start = time.perf_counter()
        engine.step()
        times.append(time.perf_counter() - start)
    step_s = statistics.median(times)
    profile = step_profile(engine, profile_dir) if profile_dir else None
    for request_id in ids:
        engine.abort(request_id)
    while engine.has_unfinished:
        engine.step()
    per_rank = -(-batch // dp)
    caches = [
        leaf for cache in runner.caches if cache is not None for leaf in jax.tree.leaves(cache)
    ]
    state_bytes = sum(2 * leaf.nbytes // leaf.shape[0] * per_rank for leaf in caches) // tp
    params_bytes = weight_bytes(model, per_rank) // tp
    reduce_bytes = allreduce_bytes(model, per_rank) * 2 * (tp - 1) / tp if tp > 1 else 0
    roofline_s = (params_bytes + state_bytes) / bandwidth + (reduce_bytes / link if link else 0)
    row = dict(
        shape=label,
        tp=tp,
        dp=dp,
        batch=batch,
        step_ms=1e3 * step_s,
        tokens_per_s=batch / step_s,
        param_gb_per_gpu=params_bytes / 1e9,
        state_gb_per_gpu=state_bytes / 1e9,
        allreduce_mb=reduce_bytes / 1e6,
        roofline_ms=1e3 * roofline_s,
        x_roofline=step_s / roofline_s,
    )
    if profile is not None:
        row["profile"] = profile
    return row


COLLECTIVES = ("nccl", "psum", "all-reduce", "all_reduce", "all-gather", "all_gather")


def step_profile(engine: Engine, trace_dir: str, steps: int = 5) -> dict:
    """GPU time of `steps` decode steps under the profiler, per step: busy and span per stream,
    the top kernels, and the collectives' kernels (NCCL's, and XLA's own all-reduce fusions,
    named after the `psum` they lower)."""
    with jax.profiler.trace(trace_dir):
        for _ in range(steps):
            engine.step()
        engine.step()  # retires the last traced step
    events = profile_events(load_trace(trace_dir))
    summary = summarize_profile(events, steps + 1)
    collectives = [e[3] for e in events if any(c in e[1].lower() for c in COLLECTIVES)]
    return dict(
        lines=summary["lines"],
        top_kernels=summary["top_kernels"][:12],
        collective_kernels_per_step=len(collectives) / (steps + 1),
        collective_us_per_step=sum(collectives) / (steps + 1) / 1e3,
    )


def prefill_row(model, label, tp, length, params) -> dict:
    """Prefill tokens/s of one `length`-token prompt in one step (compiled on a first prompt);
    shorter where the model's positions end first (it still generates one token)."""
    length = min(length, model.config.max_position_embeddings - 1)
    config = EngineArgs(
        max_num_seqs=1,
        max_num_batched_tokens=length,
        max_model_len=length + 1,
        decode_row_buckets=(2,),
        prefill_token_buckets=(length,),
        prefill_row_buckets=(1,),
        prefix_caching="off",
        tensor_parallel_size=tp,
    )
    engine = Engine(model, config, params=params)
    rng = np.random.default_rng(0)
    times = []
    for _ in range(2):  # the first compiles
        prompt = rng.integers(0, model.config.vocab_size, length).tolist()
        engine.add_request(prompt, SamplingParams(max_tokens=1))
        start = time.perf_counter()
        while engine.has_unfinished:
            engine.step()
        times.append(time.perf_counter() - start)
    return dict(
        shape=label, tp=tp, prefill_len=length, prefill_s=times[-1], tokens_per_s=length / times[-1]
    )


DECODE_COLUMNS = (
    ("shape", "shape", "{}"),
    ("tp", "tp", "{}"),
    ("dp", "dp", "{}"),
    ("B", "batch", "{}"),
    ("step ms", "step_ms", "{:.2f}"),
    ("tok/s", "tokens_per_s", "{:.0f}"),
    ("roofline ms", "roofline_ms", "{:.2f}"),
    ("x roofline", "x_roofline", "{:.2f}"),
    ("params GB/GPU", "param_gb_per_gpu", "{:.2f}"),
    ("all-reduce MB", "allreduce_mb", "{:.2f}"),
)
SETUP_COLUMNS = (
    ("shape", "shape", "{}"),
    ("tp", "tp", "{}"),
    ("dp", "dp", "{}"),
    ("weights s", "weights_s", "{:.1f}"),
    ("decode variants", "variants", "{}"),
    ("their compile s (parallel)", "warmup_s", "{:.1f}"),
    ("prefill compile s", "prefill_compile_s", "{:.1f}"),
)
PREFILL_COLUMNS = (
    ("shape", "shape", "{}"),
    ("tp", "tp", "{}"),
    ("prompt", "prefill_len", "{}"),
    ("prefill s", "prefill_s", "{:.3f}"),
    ("tok/s", "tokens_per_s", "{:.0f}"),
)


def markdown(rows: list[dict], columns: tuple[tuple[str, str, str], ...]) -> str:
    """`rows` as a markdown table of `columns` (title, key, format)."""
    lines = ["| " + " | ".join(title for title, _, _ in columns) + " |"]
    lines.append("|" + "---|" * len(columns))
    for row in rows:
        lines.append("| " + " | ".join(f.format(row[key]) for _, key, f in columns) + " |")
    return "\n".join(lines)


def print_tables(results: dict) -> None:
    tables = zip(
        (DECODE_COLUMNS, PREFILL_COLUMNS, SETUP_COLUMNS), ("rows", "prefill", "setup"), strict=True
    )
    print("\n" + "\n\n".join(markdown(results[key], columns) for columns, key in tables))


def meshes(tps: str, dps: str) -> list[tuple[int, int]]:
    """(tp, dp) pairs of the sweep that fit the devices JAX sees."""
    pairs = [(int(t), int(d)) for d in dps.split(",") for t in tps.split(",")]
    return [(t, d) for t, d in pairs if t * d <= len(jax.devices())]


def bench_mesh(args, tp: int, dp: int, bandwidth: float, save) -> None:
    """Every shape on one (tp, dp) mesh: the decode rows on one shared runner, then (dp = 1) the
    prefill row on the same parameters."""
    link = link_bandwidth(tp, 1 << (28 if jax.default_backend() == "gpu" else 20))
    print(f"tp={tp} dp={dp}: link {link / 1e9:.1f} GB/s", flush=True)
    batches = [int(b) for b in args.batches.split(",")]
    for shape in args.shapes.split(","):
        model, params = model_shapes(shape, args.small), SharedParams(RandomShards())
        label = shape if dp == 1 else f"{shape} dp={dp}"
        config = decode_config(model, batches, tp, dp)
        runner = ModelRunner(model, resolve_config(model, config), params=params)
        start = time.perf_counter()
        Engine(model, config, runner=runner).warmup()  # the decode variants, in parallel
        setup = dict(shape=label, tp=tp, dp=dp, weights_s=params.seconds)
        setup.update(variants=runner.num_variants, warmup_s=time.perf_counter() - start)
        compiled = sum(runner.compile_seconds.values())
        for batch in batches:
            trace = args.profile and tempfile.mkdtemp()
            save(
                "rows", decode_row(model, runner, label, batch, args.steps, bandwidth, link, trace)
            )
        setup["prefill_compile_s"] = sum(runner.compile_seconds.values()) - compiled  # lazily
        save("setup", setup)
        if dp == 1 and args.prefill_len:
            save("prefill", prefill_row(model, label, tp, args.prefill_len, params))
        del runner, params


def main(argv: list[str] | None = None) -> tuple[list[dict], list[dict]]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shapes", default="qwen3next80b,nemotronh47b,qwen3next20b")
    parser.add_argument("--tp", default="2", help="tensor-parallel sizes, e.g. 1,2")
    parser.add_argument("--dp", default="1", help="data-parallel sizes, e.g. 1,2")
    parser.add_argument("--batches", default="1,16,64,256")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--prefill-len", type=int, default=8192, help="0: no prefill row")
    parser.add_argument("--profile", action="store_true", help="trace 5 steps of each row")
    parser.add_argument("--small", action="store_true", help="tiny dims (CPU, fake devices)")
    args = parser.parse_args(argv)
    bandwidth = measure_bandwidth(1 << (30 if jax.default_backend() == "gpu" else 22))
    print(f"memory {bandwidth / 1e9:.0f} GB/s", flush=True)
    results = {"bandwidth": bandwidth, "rows": [], "prefill": [], "setup": []}

    def save(kind: str, row: dict) -> None:  # after every row: a run cut short keeps its rows
        results[kind].append(row)
        print(json.dumps(row), flush=True)
        if os.environ.get("OUT"):
            with open(os.path.join(os.environ["OUT"], "bench_tensor_parallel.json"), "w") as f:
                json.dump(results, f, indent=1)

    for tp, dp in meshes(args.tp, args.dp):
        bench_mesh(args, tp, dp, bandwidth, save)
    print_tables(results)
    return results["rows"], results["prefill"]
