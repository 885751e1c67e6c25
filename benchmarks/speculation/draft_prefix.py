"""What a prefix hit costs a draft-model drafter: the fill passes that prefill, on the draft model,
the tokens the target skipped (runtime/speculative/draft_model.py, module docstring, step 0).

The ~1B NemotronH-shaped random bench model (`benchmarks/harness/models.py`) is the target and the
4-layer draft model of the `spec_decode` bench drafts (K = 4), prefix caching "all". Per prompt
length L: one request of L random tokens and `--max-tokens` greedy outputs is served once (a
miss), then again (a hit at L's last state block boundary), on an engine without speculation and
on one with the draft model. Printed: time to first token of each (the hit's is what the target
still prefills, plus on the drafting engine the fill passes), the fill passes' own wall time, and
the target prefill the hit saved (miss TTFT - hit TTFT without speculation). The alternative
design, a prefix cache of the draft model's own, would save the fill time and hold one draft
state per cached state block instead (`draft state bytes`, also printed).

A first miss + hit of other prompts compiles every variant before timing (compile seconds are
printed apart).

    python -m benchmarks.speculation draft_prefix --size tiny --lengths 64,128 --max-tokens 4
    python -m benchmarks.speculation draft_prefix                                   # one GPU
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import jax
import numpy as np

from benchmarks.harness.models import build_model
from benchmarks.speculation.drafters import build_draft_model
from jmamba import HybridLM
from runtime import Engine, EngineArgs, SamplingParams, SpeculativeConfig

K = 4


def engine_config(args: argparse.Namespace, speculative: SpeculativeConfig | None) -> EngineArgs:
    lengths = [int(n) for n in args.lengths.split(",")]
    return EngineArgs(
        max_num_seqs=2,
        max_num_batched_tokens=args.budget,
        max_model_len=max(lengths) + args.max_tokens + 16,
        block_size=16,
        prefix_caching="all",
        decode_row_buckets=(2,),
        prefill_token_buckets=(args.budget,),
        prefill_row_buckets=(2,),
        speculative=speculative,
    )


class FillTimer:
    """Wraps a draft-model drafter's fill passes to add up their wall time (device included:
    each pass fetches its tokens)."""

    def __init__(self, drafter: object) -> None:
        self.seconds = 0.0
        self._fill = drafter._fill
        drafter._fill = self

    def __call__(self, schedules: list) -> None:
        start = time.perf_counter()
        self._fill(schedules)
        self.seconds += time.perf_counter() - start


def ttft(engine: Engine, prompt: list[int], max_tokens: int) -> float:
    """Serve one request to completion; its time to first token."""
    engine.add_request(prompt, SamplingParams(max_tokens=max_tokens, ignore_eos=True))
    outputs = []
    while engine.has_unfinished:
        outputs += engine.step()
    return outputs[0].time_to_first_token


def miss_then_hit(engine: Engine, prompt: list[int], max_tokens: int) -> tuple[float, float]:
    return ttft(engine, prompt, max_tokens), ttft(engine, prompt, max_tokens)


def draft_state_bytes(draft: HybridLM, engine: Engine) -> int:
    """Bytes of one draft-model state slot (conv + recurrent state of every recurrent layer)."""
    caches = engine.drafter.runner.caches
    slots = engine.drafter.config.num_slots * engine.drafter.config.data_parallel_size
    total = 0
    for layer in caches:
        if layer is None or type(layer).__name__ == "KVCache":
            continue
        total += sum(leaf.nbytes for leaf in jax.tree.leaves(layer))
    return total // slots


def run(args: argparse.Namespace) -> list[dict]:
    rng = np.random.default_rng(0)
    target, draft = build_model(args.size), build_draft_model(args.size)
    vocab = target.config.vocab_size
    plain = Engine(target, engine_config(args, None))
    spec = SpeculativeConfig("draft_model", K)
    drafting = Engine(target, engine_config(args, spec), draft_model=draft)
    fills = FillTimer(drafting.drafter)
    lengths = [int(n) for n in args.lengths.split(",")]
    for engine in (plain, drafting):  # compile every variant the timed serves use
        for n in lengths:
            miss_then_hit(engine, rng.integers(0, vocab, n).tolist(), args.max_tokens)
    compiled = plain.stats.compile_seconds + drafting.stats.compile_seconds
    print(f"compile: {compiled:.1f} s (both engines, apart from the timings below)")
    rows = []
    for n in lengths:
        prompt = rng.integers(0, vocab, n).tolist()
        plain_miss, plain_hit = miss_then_hit(plain, prompt, args.max_tokens)
        before = fills.seconds
        draft_miss, draft_hit = miss_then_hit(drafting, list(prompt), args.max_tokens)
        rows.append(
            dict(
                prompt=n,
                plain_miss_ms=plain_miss * 1e3,
                plain_hit_ms=plain_hit * 1e3,
                draft_miss_ms=draft_miss * 1e3,
                draft_hit_ms=draft_hit * 1e3,
                fill_ms=(fills.seconds - before) * 1e3,
                saved_ms=(plain_miss - plain_hit) * 1e3,
                cached_tokens=drafting.stats.prefix_cache.hit_tokens,
            )
        )
    print(f"draft state bytes: {draft_state_bytes(draft, drafting)} per cached state")
    return rows


def print_table(rows: list[dict]) -> None:
    print(
        "| prompt | TTFT miss | TTFT hit | TTFT miss, drafting | TTFT hit, drafting | fill "
        "passes | target prefill saved | fill / saved |"
    )
    print("|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        share = r["fill_ms"] / r["saved_ms"] if r["saved_ms"] > 0 else float("nan")
        print(
            f"| {r['prompt']} | {r['plain_miss_ms']:.2f} ms | {r['plain_hit_ms']:.2f} ms | "
            f"{r['draft_miss_ms']:.2f} ms | {r['draft_hit_ms']:.2f} ms | {r['fill_ms']:.2f} ms | "
            f"{r['saved_ms']:.2f} ms | {share:.2f} |"
        )


def main(argv: list[str] | None = None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size", choices=["tiny", "1b"], default="1b")
    parser.add_argument("--lengths", default="1024,4096,16384", help="prompt lengths")
    parser.add_argument("--max-tokens", type=int, default=16)
    parser.add_argument("--budget", type=int, default=4096, help="token budget per step")
    parser.add_argument("--json", help="write the rows here")
    args = parser.parse_args(argv)
    rows = run(args)
    print_table(rows)
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))
    return rows
