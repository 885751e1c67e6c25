"""Data-parallel throughput with a process per rank: DP = N rank processes against DP = 1 (one
rank process) in one run, each on its own GPU.

The bench model (`benchmarks/harness/models.py`, bf16) is written once as a checkpoint directory
(on the CPU: this front process never touches a GPU, each rank process takes its own), then
served by `RankGroup`s of 1 and N rank processes with the engine options of `data_parallel`
(per rank: `--seqs` sequences, a `--budget` token budget, one decode bucket, asynchronous
scheduling), on the same decode-heavy workload: `--requests` prompts of `--prompt-len` random
tokens, `--max-tokens` greedy output tokens each (no EOS). A short warm-up workload compiles the
programs, then `--repeats` timed runs, of which the last counts. Throughput = generated tokens /
wall time of that run; host and device ms per step are each rank's own (`StepStats`).

    python -m benchmarks.parallel rank_processes --size tiny --requests 16 --max-tokens 8  # CPU
    python -m benchmarks.parallel rank_processes --ranks 2                                # 2 GPUs
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from pathlib import Path

import jax
import numpy as np

from benchmarks.harness.models import build_model, hf_config
from jmamba.checkpoints.weights import save_pretrained
from runtime.core.sampling_params import SamplingParams
from runtime.ranks.group import RankGroup


def write_checkpoint(size: str, directory: Path) -> None:
    """The bench model of `size` as a checkpoint directory (built and written on the CPU)."""
    save_pretrained(build_model(size), directory, hf_config(size))


def serve(group: RankGroup, prompts: list[list[int]], max_tokens: int) -> tuple[float, int]:
    """Serve every prompt to completion; returns (wall seconds, generated tokens)."""
    params = SamplingParams(max_tokens=max_tokens, ignore_eos=True)
    for prompt in prompts:
        group.add_request(prompt, params)
    start, generated = time.perf_counter(), 0
    while group.has_unfinished:
        generated += sum(len(o.token_ids) for o in group.step())
    return time.perf_counter() - start, generated


def options(args: argparse.Namespace, max_model_len: int) -> dict:
    """Each rank's engine options (those of `data_parallel`'s `engine_config`, one rank)."""
    return dict(
        max_num_seqs=args.seqs,
        max_num_batched_tokens=args.budget,
        max_model_len=max_model_len,
        block_size=16,
        decode_row_buckets=(args.seqs,),
        prefill_token_buckets=(args.budget,),
        prefill_row_buckets=(args.seqs,),
        async_scheduling=True,
        decode_steps=args.decode_steps,
    )


def run(group: RankGroup, prompts: list[list[int]], args: argparse.Namespace) -> dict:
    """Warm up, then the timed runs; the last run's row."""
    warm_start = time.perf_counter()
    serve(group, prompts, 4)
    warm_s = time.perf_counter() - warm_start
    for _ in range(args.repeats):
        before = group.stats
        seconds, generated = serve(group, prompts, args.max_tokens)
    after = group.stats
    steps = [
        a.num_live_steps - b.num_live_steps for a, b in zip(after.ranks, before.ranks, strict=True)
    ]
    host = after.host_seconds - before.host_seconds
    device = after.device_seconds - before.device_seconds
    total_steps = after.num_steps - before.num_steps
    return dict(
        ranks=len(group.ranks),
        seconds=seconds,
        generated=generated,
        tokens_per_s=generated / seconds,
        live_steps=steps,
        host_ms=1e3 * host / max(total_steps, 1),
        device_ms=1e3 * device / max(total_steps, 1),
        warmup_s=warm_s,
        variants=group.num_variants,
    )


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", choices=["tiny", "1b"], default="1b")
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--requests", type=int, default=512)
    parser.add_argument("--prompt-len", type=int, default=128)
    parser.add_argument("--max-tokens", type=int, default=256)
    parser.add_argument("--seqs", type=int, default=256, help="max_num_seqs per rank")
    parser.add_argument("--budget", type=int, default=4096, help="token budget per rank")
    parser.add_argument("--decode-steps", type=int, default=1, help="decode steps a program")
    parser.add_argument("--repeats", type=int, default=2, help="timed runs; the last counts")
    args = parser.parse_args(argv)
    jax.config.update("jax_platforms", "cpu")  # the front builds the checkpoint on the CPU
    rng = np.random.default_rng(0)
    vocab = hf_config(args.size)["vocab_size"]
    prompts = [rng.integers(0, vocab, args.prompt_len).tolist() for _ in range(args.requests)]
    max_len = 1 << (args.prompt_len + args.max_tokens).bit_length()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        start = time.perf_counter()
        write_checkpoint(args.size, Path(tmp))
        print(f"checkpoint written in {time.perf_counter() - start:.1f} s", flush=True)
        for ranks in sorted({1, args.ranks}):
            group = RankGroup.start(
                tmp, num_ranks=ranks, dtype="auto", warmup=False, options=options(args, max_len)
            )
            try:
                rows.append(run(group, prompts, args))
            finally:
                group.close()
            print(json.dumps(rows[-1]), flush=True)
    result: dict = dict(rows=rows, args=vars(args))
    if args.ranks > 1:
        result["speedup"] = rows[-1]["tokens_per_s"] / rows[0]["tokens_per_s"]
    if os.environ.get("OUT"):
        with open(os.path.join(os.environ["OUT"], "bench_rank_processes.json"), "w") as f:
            json.dump(result, f, indent=1)
    print("ranks  tokens/s   seconds  host ms/step  device ms/step")
    for r in rows:
        print(
            f"{r['ranks']:5d} {r['tokens_per_s']:9.0f} {r['seconds']:9.2f} "
            f"{r['host_ms']:12.2f} {r['device_ms']:15.2f}"
        )
    if "speedup" in result:
        print(f"DP={args.ranks} rank processes / DP=1: {result['speedup']:.2f}x tokens/s")
    return result


if __name__ == "__main__":
    main()
