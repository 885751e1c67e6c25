"""Prefix caching off / align / all: time to first token, throughput and hit rate.

The random NemotronH-shaped bench model (`benchmarks/harness/models.py`, `build_model`: Mamba2,
MLP and two attention layers, bf16 weights, fp32 state), greedy, every request generating exactly
`--output-len` tokens (EOS ignored). Two workloads, each run once per mode on a fresh engine (fresh
pools and an empty prefix cache):

  shared  `--requests` requests, all submitted at once: a common `--prefix-len`-token prefix
          plus `--own-len` tokens of their own.
  chat    `--conversations` conversations of `--turns` turns: turn 1 is `--first-len` tokens;
          turn t + 1's prompt is turn t's prompt + its answer + a new `--question-len`-token
          question, submitted as soon as turn t finishes (conversations run side by side).

Per workload and mode: TTFT mean and p99 (seconds from `add_request` to the first sampled
token, taken on the host after the step that sampled it: the step call waits for its tokens,
so the device is synchronised), generated tokens/s and total (prompt + generated) tokens/s over
the wall time of the run (compile-free: `compiled_while_timed` counts variants compiled during
it, 0 expected), hit rate = prompt tokens taken from the cache / prompt tokens (for
chat also over turns >= 2 alone), steps, and the prefix cache counters.

Shapes are fixed so that few step variants exist: one decode bucket of max_num_seqs rows and one
prefill bucket of (token budget, max_num_seqs rows), 3 variants per runner; "off" has a runner of
its own (no boundary slots), "align" and "all" share one. Every variant is compiled by a warm-up
before anything is timed; compile seconds are reported apart.

    python -m benchmarks.serving prefix_cache                          # GPU (1b, ~3 minutes)
    python -m benchmarks.serving prefix_cache --size tiny --requests 4 --prefix-len 64 \\
        --own-len 16 --output-len 4 --conversations 2 --turns 2 --first-len 32 \\
        --question-len 16 --max-num-seqs 4 --budget 64 --max-cached-states 16   # CPU smoke
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import os
import time

import numpy as np

from benchmarks.harness.models import build_model
from jmamba import HybridLM
from runtime.core.buckets import Bucket, BucketPolicy, lane_width
from runtime.core.engine_args import EngineArgs
from runtime.core.sampling_params import SamplingParams
from runtime.device.memory import resolve_config
from runtime.device.model_runner import ModelRunner
from runtime.engine import Engine
from runtime.outputs.request_output import RequestOutput

MODES = ("off", "align", "all")
FIRST_TOKEN_ID = 3  # random prompts avoid the low ids (EOS and friends)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--size", choices=["tiny", "1b"], default="1b")
    parser.add_argument("--modes", default=",".join(MODES))
    parser.add_argument("--workloads", default="shared,chat")
    parser.add_argument("--requests", type=int, default=64)
    parser.add_argument("--prefix-len", type=int, default=4096)
    parser.add_argument("--own-len", type=int, default=128)
    parser.add_argument("--output-len", type=int, default=128)
    parser.add_argument("--conversations", type=int, default=8)
    parser.add_argument("--turns", type=int, default=4)
    parser.add_argument("--first-len", type=int, default=1024)
    parser.add_argument("--question-len", type=int, default=64)
    parser.add_argument("--max-num-seqs", type=int, default=64)
    # 1024, not 4096: the prefill attention (the ragged jnp reference until a Pallas prefill
    # kernel exists) gathers each token's whole context, ~13 MB per token at a 4k context on the
    # 1b model, and 4096 tokens ran out of the H100's memory.
    parser.add_argument("--budget", type=int, default=1024, help="tokens per step")
    parser.add_argument("--max-cached-states", type=int, default=128)
    parser.add_argument("--seed", type=int, default=0)
    return parser.parse_args(argv)


def engine_config(args: argparse.Namespace, mode: str, max_model_len: int) -> EngineArgs:
    seqs = args.max_num_seqs
    return EngineArgs(
        max_num_seqs=seqs,
        max_num_batched_tokens=args.budget,
        max_model_len=max_model_len,
        block_size=16,
        prefix_caching=mode,
        max_cached_states=args.max_cached_states,
        decode_row_buckets=(seqs,),
        prefill_token_buckets=(args.budget,),
        prefill_row_buckets=(seqs,),
        seed=args.seed,
    )


def every_bucket(policy: BucketPolicy) -> list[Bucket]:
    """Every bucket `policy.bucket_for` can return (decode rows or none x prefill or none)."""
    prefill = [(0, 0), *itertools.product(policy.prefill_tokens, policy.prefill_rows)]
    decode = (0, *policy.decode_rows)
    buckets = {
        Bucket(rows, lane_width(rows, width), tokens, prefill_rows)
        for rows in decode
        for width in policy.widths
        for tokens, prefill_rows in prefill
    }
    return sorted(b for b in buckets if b.num_decode_rows or b.num_prefill_rows)


def warm_runner(model: HybridLM, config: EngineArgs) -> ModelRunner:
    """A runner with every step variant of `config` compiled (on all-padding steps)."""
    runner = ModelRunner(model, resolve_config(model, config))
    runner.warmup(every_bucket(BucketPolicy(runner.config)))
    return runner


def random_tokens(rng: np.random.Generator, vocab_size: int, n: int) -> list[int]:
    return rng.integers(FIRST_TOKEN_ID, vocab_size, n).tolist()


def run_shared(engine: Engine, args: argparse.Namespace, vocab: int) -> list[RequestOutput]:
    """All requests submitted at once, served to completion."""
    rng = np.random.default_rng(args.seed)
    prefix = random_tokens(rng, vocab, args.prefix_len)
    params = SamplingParams(max_tokens=args.output_len, ignore_eos=True)
    for _ in range(args.requests):
        engine.add_request(prefix + random_tokens(rng, vocab, args.own_len), params)
    outputs = []
    while engine.has_unfinished:
        outputs += engine.step()
    return outputs


def run_chat(engine: Engine, args: argparse.Namespace, vocab: int) -> list[RequestOutput]:
    """Conversations side by side; each next turn is submitted when the previous one finishes.
    Request ids are "<conversation>.<turn>" (turns from 1)."""
    rng = np.random.default_rng(args.seed + 1)
    params = SamplingParams(max_tokens=args.output_len, ignore_eos=True)
    prompts: dict[str, list[int]] = {}
    for c in range(args.conversations):
        prompts[f"{c}.1"] = random_tokens(rng, vocab, args.first_len)
        engine.add_request(prompts[f"{c}.1"], params, request_id=f"{c}.1")
    outputs = []
    while engine.has_unfinished:
        for output in engine.step():
            outputs.append(output)
            conversation, turn = (int(part) for part in output.request_id.split("."))
            if turn < args.turns:
                nxt = f"{conversation}.{turn + 1}"
                question = random_tokens(rng, vocab, args.question_len)
                prompts[nxt] = prompts[output.request_id] + output.token_ids + question
                engine.add_request(prompts[nxt], params, request_id=nxt)
    return outputs


def hit_rate(outputs: list[RequestOutput]) -> float:
    prompt = sum(len(o.prompt_token_ids) for o in outputs)
    return sum(o.num_cached_tokens for o in outputs) / prompt if prompt else 0.0


def measure(engine: Engine, workload: str, args: argparse.Namespace, vocab: int) -> dict:
    run = run_shared if workload == "shared" else run_chat
    steps0, variants0 = engine.stats.num_steps, engine.num_variants
    start = time.perf_counter()
    outputs = run(engine, args, vocab)
    seconds = time.perf_counter() - start
    ttft = np.array([o.time_to_first_token for o in outputs])
    generated = sum(len(o.token_ids) for o in outputs)
    prompt = sum(len(o.prompt_token_ids) for o in outputs)
    stats = engine.stats.prefix_cache
    row = dict(
        workload=workload,
        mode=engine.config.prefix_caching,
        requests=len(outputs),
        seconds=seconds,
        steps=engine.stats.num_steps - steps0,
        ttft_mean_s=float(ttft.mean()),
        ttft_p99_s=float(np.percentile(ttft, 99)),
        output_tokens_per_s=generated / seconds,
        total_tokens_per_s=(prompt + generated) / seconds,
        prompt_tokens=prompt,
        output_tokens=generated,
        hit_rate=hit_rate(outputs),
        compiled_while_timed=engine.num_variants - variants0,
        cache=None if stats is None else vars(stats),
    )
    if workload == "chat":
        later = [o for o in outputs if not o.request_id.endswith(".1")]
        row["hit_rate_turns_2_plus"] = hit_rate(later)
    return row


def max_model_len(args: argparse.Namespace, block_size: int = 16) -> int:
    shared = args.prefix_len + args.own_len + args.output_len
    chat = args.first_len + args.turns * args.output_len + (args.turns - 1) * args.question_len
    return block_size * math.ceil(max(shared, chat) / block_size)


def print_table(rows: list[dict]) -> None:
    print("workload mode   ttft_mean_s ttft_p99_s  out_tok/s  total_tok/s  hit_rate  hit_2+  steps")
    for r in rows:
        later = r.get("hit_rate_turns_2_plus")
        print(
            f"{r['workload']:8s} {r['mode']:5s} {r['ttft_mean_s']:11.4f} {r['ttft_p99_s']:10.4f} "
            f"{r['output_tokens_per_s']:10.0f} {r['total_tokens_per_s']:12.0f} "
            f"{r['hit_rate']:9.3f} {'' if later is None else f'{later:6.3f}':>7s} "
            f"{r['steps']:6d}"
        )


def main(argv: list[str] | None = None) -> list[dict]:
    args = parse_args(argv)
    model = build_model(args.size)
    vocab, length = model.config.vocab_size, max_model_len(args)
    modes = args.modes.split(",")
    workloads = args.workloads.split(",")
    rows, compile_s = [], {}
    runner = None
    for mode in modes:
        config = engine_config(args, mode, length)
        if runner is None or (mode == "off") != (runner.config.prefix_caching == "off"):
            runner = None  # free the previous runner's caches before allocating new ones
            start = time.perf_counter()
            runner = warm_runner(model, config)
            compile_s[mode] = time.perf_counter() - start
        for workload in workloads:
            rows.append(measure(Engine(model, config, runner=runner), workload, args, vocab))
            print(json.dumps(rows[-1]), flush=True)
    print(
        f"model={args.size} max_model_len={length} budget={args.budget} "
        f"max_num_seqs={args.max_num_seqs} compile+warm-up s: "
        f"{ {m: round(s, 1) for m, s in compile_s.items()} }"
    )
    print_table(rows)
    if os.environ.get("OUT"):
        os.makedirs(os.environ["OUT"], exist_ok=True)
        with open(os.path.join(os.environ["OUT"], "bench_prefix_cache.json"), "w") as f:
            json.dump(
                {"args": vars(args), "max_model_len": length, "compile_s": compile_s, "rows": rows},
                f,
                indent=1,
            )
    return rows
