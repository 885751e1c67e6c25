"""Speculative decoding: decode tokens/s and acceptance with and without drafts at B = 1, 16, 64.

The ~1B NemotronH-shaped random bench model (`benchmarks/harness/models.py`, bf16 weights) serves
greedy requests B at a time (ignore_eos, `--max-tokens` each) whose prompts repeat a random
`--phrase-len`-token phrase `--repeats` times (a different phrase per request), so prompt lookup can
hit. Methods:

- `none`: no speculation (decode rows of one lane): the baseline.
- `ngram-K`: prompt lookup (n = 2..4) with K drafts.
- `oracle-K` (UPPER BOUND, not a real drafter): proposes the baseline's own greedy continuation,
  so every draft is right while outputs agree; it shows what the 1 + K lane mechanics give at full
  acceptance with free drafts.
- `draft-K`: a small random draft model of the same vocabulary (~10x fewer weights; random models
  rarely agree, so its acceptance shows the cost side).
- `self-K` (UPPER BOUND of draft-model acceptance): the target as its own draft model; every draft
  must be accepted, at the price of K + 1 target-sized draft passes per step (in bf16 on the GPU
  only with `--batch-invariant`: XLA's GEMMs and reductions round a row by the step's shape).
- `mtp-K`: a random MTP head (an attention block and an MLP block, `jmamba.mtp`) drafting inside
  the target's step: random, its drafts are rejected, so it shows the cost side of the head.
- `ngram-K@B`, `mtp-K@B`: drafts only in steps with at most B running requests
  (`SpeculativeConfig.max_batch_size`); with `--async-scheduling` the larger steps run
  asynchronously, as the `none` baseline then does, and so do mtp's drafting steps (the next
  step is scheduled as if every draft will be accepted; docs/architecture.md section 4).
- `ngram-K@auto`, `mtp-K@auto`: drafts where it measures that drafting pays
  (`SpeculativeConfig.adaptive`, `runtime.speculative.gate.MeasuredGate`); as in a server, the
  gate keeps what it measured from one serve to the next (it learns during the warm-up serves).

`--size stdlib` serves the trained `tiny-stdlib` preset instead (fp32, its trained MTP head for
`mtp-K`), on `--prompt-len`-byte prompts cut at line starts from the held-out files of the
running interpreter's standard library (`scripts/stdlib_corpus.py`, as `scripts/measure_mtp.py`
cuts them): acceptance on real text, and what it buys in tokens/s (none, ngram-K, mtp-K only).

One runner per lane width (and per draft model) serves every batch size (decode row buckets
1, 16, 64), and a short warm-up serve of the same shape compiles every variant before timing.
The host's speed drifts between runs on a shared machine (up to 1.5x on the H100 hosts), so the
methods of a batch size are timed in `--rounds` interleaved rounds, a fresh engine per serve.
A serve at batch size B serves max(B, `--requests`) prompts in waves of B, each wave once the
one before has finished (at B = 1 one request at a time, as an idle server gets them: until
2026-11-27 the B = 1 rows served one prompt, so one prompt's acceptance made the figure).
tokens/s = decode tokens / wall time of the decode phases (in each wave, from the first step in
which no request is waiting or prefilling and every request's first token has retired, to the
end; before 2026-11-27 an asynchronous engine's decode phase began one step early and held the
wait for the prefill), the median over rounds, with the rounds' spread beside it (min-max /
median);
acceptance = accepted / proposed drafts; accepted per step = accepted drafts
per decode row per step (the row gains 1 + that many tokens); drafting steps = the share of
the last serve's steps that drafted (the draft gate's choice); differ = requests of the last
serve whose greedy tokens are not `none`'s (lossless drafting gives 0 in fp32).

    python -m benchmarks.speculation spec_decode --size tiny --batches 1,2 --max-tokens 8  # CPU
    python -m benchmarks.speculation spec_decode                                          # GPU
    python -m benchmarks.speculation spec_decode --size stdlib \
        --methods none,ngram-4,mtp-1,mtp-2,mtp-3
    python -m benchmarks.speculation spec_decode --size stdlib --async-scheduling \
        --methods none,mtp-1,mtp-1@16
"""

from __future__ import annotations

import argparse
import json
import os
import time

import jax
import numpy as np

from benchmarks.harness.models import build_model
from benchmarks.speculation.drafters import OracleDrafter, build_draft_model, parse_method
from benchmarks.speculation.serving import (
    differing,
    engine_config,
    serve,
    serve_waves,
    stdlib_prompts,
    workload,
)
from jmamba import HybridLM
from jmamba.loading import load_model
from runtime.core.engine_args import EngineArgs
from runtime.core.speculative_config import SpeculativeConfig
from runtime.device.memory import resolve_config
from runtime.device.model_runner import ModelRunner
from runtime.engine import Engine
from runtime.speculative.draft_model import draft_engine_args
from runtime.speculative.gate import DraftGate

METHODS = ("none", "ngram-2", "ngram-4", "oracle-4", "draft-4", "self-4", "mtp-1", "mtp-3")


class Bench:
    """The models, prompts, runners and gates of one bench run: engines for each method on
    runners shared per lane width (and per draft model), warmed up, then timed in rounds."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.batches = tuple(int(b) for b in args.batches.split(","))
        self.num_prompts = max(*self.batches, args.requests)
        if args.size == "stdlib":
            self.model = self.mtp_model = load_model("tiny-stdlib")[0]
            self.prompts = stdlib_prompts(self.num_prompts, args.prompt_len)
            prompt_len = args.prompt_len
        else:
            self.model, self.mtp_model = build_model(args.size), build_model(args.size, mtp=True)
            self.prompts = workload(
                self.model.config.vocab_size, self.num_prompts, args.phrase_len, args.repeats
            )
            prompt_len = args.phrase_len * args.repeats
        max_len = prompt_len + args.max_tokens + 16
        self.max_model_len = 1 << (max_len - 1).bit_length()
        self.budget = max(args.budget, self.model.config.chunk_size)
        self.draft_model = None if args.size == "stdlib" else build_draft_model(args.size)
        self.runners: dict[tuple, ModelRunner] = {}
        self.truth: dict[str, list[int]] = {}
        self.gates: dict[str, DraftGate] = {}

    def config(self, method: str) -> EngineArgs:
        kind, k, limit, adaptive = parse_method(method)
        spec = None
        if kind in ("ngram", "oracle", "mtp"):
            method = "mtp" if kind == "mtp" else "ngram"
            spec = SpeculativeConfig(method, k, max_batch_size=limit, adaptive=adaptive)
        elif kind in ("draft", "self"):
            spec = SpeculativeConfig("draft_model", k)
        sizes = (max(self.batches), self.batches, self.max_model_len, self.budget)
        args = self.args
        return engine_config(*sizes, spec, args.async_scheduling, args.batch_invariant)

    def runner(self, key: tuple, model: HybridLM, config: EngineArgs) -> ModelRunner:
        if key not in self.runners:
            self.runners[key] = ModelRunner(model, resolve_config(model, config))
        return self.runners[key]

    def engine(self, method: str) -> Engine:
        kind, k, *_ = parse_method(method)
        config = self.config(method)
        model = self.mtp_model if kind == "mtp" else self.model
        runner = self.runner(
            (kind == "mtp", config.speculative_config and config.speculative_config.width),
            model,
            config,
        )
        if kind not in ("draft", "self"):
            engine = Engine(model, config, runner=runner)
            if kind == "oracle":
                engine.drafter = OracleDrafter(self.oracle_truth(), config.speculative_config)
            # A server's gate learns once: every serve of a method shares the first one's.
            engine.gate = self.gates.setdefault(method, engine.gate)
            return engine
        draft = self.model if kind == "self" else self.draft_model
        draft_args = draft_engine_args(runner.config)
        draft_runner = self.runner((kind, k), draft, draft_args)
        return Engine(
            self.model, config, runner=runner, draft_model=draft, draft_runner=draft_runner
        )

    def oracle_truth(self) -> dict[str, list[int]]:
        """The baseline's greedy continuation of every prompt (served once, on first use)."""
        if not self.truth:
            engine = self.engine("none")
            self.truth.update(serve(engine, self.prompts, self.args.max_tokens)["outputs"])
        return self.truth

    def warm(self, method: str, batch: int) -> None:
        """Compile what serving `batch` requests with `method` runs."""
        engine = self.engine(method)
        engine.warmup()
        serve(engine, self.prompts[:batch], min(self.args.max_tokens, 8))  # prefill, mixed

    def time(self, method: str, batch: int) -> tuple[dict, Engine]:
        """One timed serve of max(`batch`, --requests) requests in waves of `batch`, by a fresh
        engine (the warmed runners)."""
        engine = self.engine(method)
        prompts = self.prompts[: max(batch, self.args.requests)]
        return serve_waves(engine, prompts, batch, self.args.max_tokens), engine

    def rows(self, methods: list[str], batch: int) -> list[dict]:
        """Each method at `batch`: warmed, then timed in interleaved rounds (module docstring)."""
        for method in methods:
            self.warm(method, batch)
        compiled = self.compile_seconds()
        served: dict[str, list] = {method: [] for method in methods}
        for _ in range(self.args.rounds):
            for method in methods:
                served[method].append(self.time(method, batch))
        truth = served["none"][-1][0]["outputs"] if "none" in methods else None
        return [
            self.row(method, batch, served[method], self.compile_seconds() - compiled, truth)
            for method in methods
        ]

    @staticmethod
    def row(
        method: str,
        batch: int,
        served: list,
        compile_in_timing_s: float,
        truth: dict[str, list[int]] | None,
    ) -> dict:
        """`differ`: requests of the last serve whose greedy tokens are not `none`'s (None without
        a `none` row); fp32 must give 0, bf16 may not (lane shapes change the rounding). The
        step and draft counts are the last serve's, every wave of it."""
        rates = [result["decode_tokens"] / result["decode_s"] for result, _ in served]
        median = float(np.median(rates))
        result, engine = served[-1]
        spec = engine.stats.speculation
        return dict(
            method=method,
            batch=batch,
            tokens_per_s=median,
            spread=(max(rates) - min(rates)) / median,
            rounds=rates,
            decode_tokens=result["decode_tokens"],
            steps=engine.stats.num_steps,
            drafting_steps=engine.stats.num_drafting_steps,
            drafted=spec.num_drafted,
            accepted=spec.num_accepted,
            acceptance=spec.acceptance_rate,
            accepted_per_step=spec.num_accepted / spec.num_rows if spec.num_rows else 0.0,
            compile_in_timing_s=compile_in_timing_s,
            differ=None if truth is None else differing(result["outputs"], truth),
        )

    def compile_seconds(self) -> float:
        return sum(sum(r.compile_seconds.values()) for r in self.runners.values())


def main(argv: list[str] | None = None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", choices=["tiny", "1b", "stdlib"], default="1b")
    parser.add_argument("--batches", default="1,16,64")
    parser.add_argument("--methods", default=",".join(METHODS))
    parser.add_argument("--phrase-len", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=8)
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--prompt-len", type=int, default=96, help="--size stdlib: prompt bytes")
    parser.add_argument("--budget", type=int, default=4096, help="token budget per step")
    parser.add_argument("--rounds", type=int, default=3, help="timed serves per method")
    parser.add_argument(
        "--requests",
        type=int,
        default=16,
        help="requests a serve at batch size B serves, in waves of B (B more when larger)",
    )
    parser.add_argument(
        "--async-scheduling",
        action=argparse.BooleanOptionalAction,
        default=False,
        help="every engine schedules asynchronously (ngram in the steps without drafts, mtp in "
        "every step: a method 'kind-K@B' drafts only while at most B requests run)",
    )
    parser.add_argument(
        "--batch-invariant",
        action=argparse.BooleanOptionalAction,
        default=False,
        help="products and norms in an order fixed by static shapes "
        "(EngineConfig.batch_invariant): self-K then accepts every draft in bf16 too",
    )
    args = parser.parse_args(argv)
    methods = args.methods.split(",")
    bench = Bench(args)
    print(
        f"device={jax.devices()[0].device_kind} prompt="
        f"{args.prompt_len if args.size == 'stdlib' else f'{args.phrase_len}x{args.repeats}'} "
        f"max_tokens={args.max_tokens}",
        flush=True,
    )
    start, rows = time.perf_counter(), []
    for batch in bench.batches:
        for row in bench.rows(methods, batch):
            rows.append(row)
            print(json.dumps(row), flush=True)
    base = {r["batch"]: r["tokens_per_s"] for r in rows if r["method"] == "none"}
    for r in rows:
        r["speedup"] = r["tokens_per_s"] / base[r["batch"]] if r["batch"] in base else None
    result = dict(
        args=vars(args),
        rows=rows,
        wall_s=time.perf_counter() - start,
        compile_s=bench.compile_seconds(),
    )
    if os.environ.get("OUT"):
        with open(os.path.join(os.environ["OUT"], "bench_spec_decode.json"), "w") as f:
            json.dump(result, f, indent=1)
    print_table(rows, result)
    return rows


def print_table(rows: list[dict], result: dict) -> None:
    """The rows as a table, then the run's wall and compile seconds."""
    header = "method        B   tokens/s  spread  speedup  drafting steps  drafted  accepted"
    print(header + "  acceptance  accepted/step  differ")
    for r in rows:
        speedup = "" if r["speedup"] is None else f"{r['speedup']:.2f}x"
        drafting = r["drafting_steps"] / r["steps"]
        print(
            f"{r['method']:12s} {r['batch']:3d} {r['tokens_per_s']:10.0f} {r['spread']:6.0%} "
            f"{speedup:>8s} {drafting:15.0%} {r['drafted']:8d} {r['accepted']:9d} "
            f"{r['acceptance']:10.1%} {r['accepted_per_step']:13.2f} {r['differ']!s:>7s}"
        )
    print(
        f"wall {result['wall_s']:.0f} s, compile {result['compile_s']:.0f} s "
        "(oracle-K and self-K are upper bounds, not drafters)"
    )
