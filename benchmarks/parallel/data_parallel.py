"""Data-parallel throughput (DP = 1 vs DP = N in one run) and the idle-rank check on real GPUs.

The ~1B NemotronH-shaped bench model (`benchmarks/harness/models.py`, bf16 weights, fp32 state)
serves a decode-heavy workload: `--requests` prompts of `--prompt-len` random tokens, `--max-tokens`
greedy output tokens each (no EOS: every request generates all of them). Per rank: 256 sequences, a
4096 token budget, one decode bucket, so each configuration compiles three step variants
(decode-only, mixed, prefill-only); a short warm-up workload compiles them before the timed runs, of
which the last counts (`--repeats`, 2: a first run paid one-time costs on the H100:
benchmarks/results/log/2026-11-26.md). Throughput = generated tokens / wall time of that run
(prefill included).

Then the idle-rank check: rank 1 first serves requests (so its shard holds live state), then every
request is pinned to rank 0 while rank 1 runs only all-padding steps; rank 1's non-NULL blocks and
slots are read back before and after and compared bit for bit.

    python -m benchmarks.parallel data_parallel --size tiny --requests 16 --max-tokens 8  # CPU
    python -m benchmarks.parallel data_parallel                                          # 2 GPUs
    python -m benchmarks.parallel data_parallel --async-scheduling  # host work under the device's
"""

from __future__ import annotations

import argparse
import json
import os
import time

import jax
import numpy as np

from benchmarks.harness.models import build_model
from benchmarks.harness.serving import bench_config
from jmamba import HybridLM
from runtime.core.engine_args import EngineArgs
from runtime.core.sampling_params import SamplingParams
from runtime.device.memory import resolve_config
from runtime.device.model_runner import ModelRunner
from runtime.engine import Engine


def engine_config(
    ranks: int, seqs: int, budget: int, max_model_len: int, async_scheduling: bool
) -> EngineArgs:
    return bench_config(
        seqs,
        budget,
        max_model_len,
        (seqs,),
        data_parallel_size=ranks,
        async_scheduling=async_scheduling,
    )


def serve(engine: Engine, prompts: list[list[int]], max_tokens: int) -> tuple[float, int]:
    """Serve every prompt to completion; returns (wall seconds, generated tokens)."""
    params = SamplingParams(max_tokens=max_tokens)
    for prompt in prompts:
        engine.add_request(prompt, params)
    start, generated = time.perf_counter(), 0
    while engine.has_unfinished:
        generated += sum(len(o.token_ids) for o in engine.step())
    return time.perf_counter() - start, generated


class Pinned:
    def __init__(self, rank: int) -> None:
        self.rank = rank

    def place(self, request, schedulers) -> int:
        return self.rank


def rank_shard(runner: ModelRunner, rank: int) -> list[np.ndarray]:
    ranks, out = runner.mesh.size, []
    for leaf in jax.tree.leaves(runner.caches):
        n = leaf.shape[0] // ranks
        out.append(np.asarray(leaf[rank * n + 1 : (rank + 1) * n]))
    return out


def idle_rank_check(model, config: EngineArgs, runner: ModelRunner, prompts, max_tokens) -> dict:
    """Rank 1 serves, then sits idle while rank 0 serves everything: rank 1's shard unchanged?"""
    serve(Engine(model, config, runner=runner, router=Pinned(1)), prompts[:8], max_tokens)
    before = rank_shard(runner, 1)
    live = sum(int(np.any(b != 0)) for b in before)
    engine = Engine(model, config, runner=runner, router=Pinned(0))
    serve(engine, prompts, max_tokens)
    after = rank_shard(runner, 1)
    same = all(b.tobytes() == a.tobytes() for b, a in zip(before, after, strict=True))
    return dict(
        idle_steps=engine.stats.ranks[1].num_idle_steps,
        pools_with_live_state=live,
        pools=len(before),
        bit_identical=same,
    )


def add_workload_arguments(parser: argparse.ArgumentParser) -> None:
    """The workload's options."""
    parser.add_argument("--size", choices=["tiny", "1b"], default="1b")
    parser.add_argument("--requests", type=int, default=512)
    parser.add_argument("--prompt-len", type=int, default=128)
    parser.add_argument("--max-tokens", type=int, default=256)
    parser.add_argument("--seqs", type=int, default=256, help="max_num_seqs per rank")
    parser.add_argument("--budget", type=int, default=4096, help="token budget per rank")
    parser.add_argument(
        "--async-scheduling", action="store_true", help="dispatch step N+1 before fetching N"
    )


def workload(args: argparse.Namespace) -> tuple[HybridLM, list[list[int]], int]:
    """(model, prompts, max_model_len) of the parsed workload options."""
    model = build_model(args.size)
    vocab = model.config.vocab_size
    rng = np.random.default_rng(0)
    prompts = [rng.integers(0, vocab, args.prompt_len).tolist() for _ in range(args.requests)]
    return model, prompts, 1 << (args.prompt_len + args.max_tokens).bit_length()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_workload_arguments(parser)
    parser.add_argument("--ranks", type=int, default=jax.device_count())
    parser.add_argument("--repeats", type=int, default=2, help="timed runs; the last counts")
    args = parser.parse_args(argv)
    model, prompts, max_len = workload(args)
    print(f"device={jax.devices()[0].device_kind} x{jax.device_count()}", flush=True)
    rows, runner, config = [], None, None
    for ranks in sorted({1, args.ranks}):
        config = engine_config(ranks, args.seqs, args.budget, max_len, args.async_scheduling)
        runner = ModelRunner(model, resolve_config(model, config))
        warm_start = time.perf_counter()
        serve(Engine(model, config, runner=runner), prompts, 4)
        warm_s = time.perf_counter() - warm_start
        for _ in range(args.repeats):  # the last run counts: the first may pay one-time costs
            engine = Engine(model, config, runner=runner)
            seconds, generated = serve(engine, prompts, args.max_tokens)
        stats = engine.stats
        rows.append(
            dict(
                ranks=ranks,
                seconds=seconds,
                generated=generated,
                tokens_per_s=generated / seconds,
                steps=stats.num_steps,
                host_ms=1e3 * stats.host_seconds / stats.num_steps,
                device_ms=1e3 * stats.device_seconds / stats.num_steps,
                idle_steps=[r.num_idle_steps for r in engine.stats.ranks],
                warmup_s=warm_s,
                variants=runner.num_variants,
            )
        )
        print(json.dumps(rows[-1]), flush=True)
    result = dict(rows=rows)
    if args.ranks > 1:
        result["idle_rank"] = idle_rank_check(model, config, runner, prompts[:64], 32)
        print(json.dumps(result["idle_rank"]), flush=True)
        result["speedup"] = rows[-1]["tokens_per_s"] / rows[0]["tokens_per_s"]
    if os.environ.get("OUT"):
        with open(os.path.join(os.environ["OUT"], "bench_data_parallel.json"), "w") as f:
            json.dump(result, f, indent=1)
    print("ranks  tokens/s   seconds  steps  host ms/step  device ms/step")
    for r in rows:
        print(
            f"{r['ranks']:5d} {r['tokens_per_s']:9.0f} {r['seconds']:9.2f} {r['steps']:6d} "
            f"{r['host_ms']:12.2f} {r['device_ms']:15.2f}"
        )
    if "speedup" in result:
        print(
            f"DP={args.ranks} / DP=1 tokens/s: {result['speedup']:.2f}x; idle rank shard "
            f"bit-identical: {result['idle_rank']['bit_identical']}"
        )
