"""`jmamba bench`: a serving benchmark against a running server (`--url`) or an engine in this
process (`--model` and the engine options), printing time to first token, time per output token,
latency and throughput. A few warm-up requests run first and are not counted (they pay for
compiling); the seed of the workload is fresh each run unless `--seed` is given, so no prefix
cached by an earlier run inflates the hit rate."""

from __future__ import annotations

import argparse
import asyncio
import json
import secrets
import time
from pathlib import Path

from runtime.cli.engine_options import HelpFormatter, add_engine_options, engine_options

WARMUP_REQUESTS = 4


def add_command(commands: argparse._SubParsersAction) -> None:
    """Register `jmamba bench` and its options."""
    bench = commands.add_parser(
        "bench",
        help="measure a server (or an in-process engine) on a workload",
        formatter_class=HelpFormatter,
        description="Serving benchmark: TTFT, time per output token, latency (mean, p50, p99) "
        "and request / token throughput, at a concurrency or a request rate.",
    )
    bench.add_argument(
        "--url", default=None, help="a running jmamba serve (default: an engine in this process)"
    )
    bench.add_argument(
        "--workload",
        choices=["random", "shared-prefix", "chat"],
        default="random",
        help="ShareGPT-like random lengths, shared prompt prefixes, or multi-turn chats",
    )
    bench.add_argument("--num-requests", type=int, default=64, help="requests (chat: turns)")
    pace = bench.add_mutually_exclusive_group()
    pace.add_argument("--concurrency", type=int, default=None, help="sessions at once (default: 8)")
    pace.add_argument("--request-rate", type=float, default=None, help="sessions per second")
    bench.add_argument("--prompt-chars", type=int, default=200, help="median prompt text length")
    bench.add_argument("--answer-tokens", type=int, default=64, help="median answer length")
    bench.add_argument("--turns", type=int, default=3, help="chat: turns per conversation")
    bench.add_argument("--seed", type=int, default=None, help="workload seed (default: fresh)")
    bench.add_argument("--json", default=None, help="also write the numbers to this file")
    add_engine_options(bench, max_num_seqs=32)
    bench.set_defaults(run=run)


def run(args: argparse.Namespace, started: float) -> int:
    """Build the target and the workload, warm up, run, print the table."""
    from runtime.bench.report import summary, table
    from runtime.bench.runner import run_sessions

    seed = args.seed if args.seed is not None else secrets.randbelow(2**31)
    concurrency = args.concurrency if args.request_rate is None else None
    if concurrency is None and args.request_rate is None:
        concurrency = 8

    async def measure() -> dict[str, float]:
        target, max_model_len = await _target(args)
        try:
            spec = _spec(args, max_model_len)
            warm = _warmup_sessions(spec, seed)
            await run_sessions(target, warm, concurrency=len(warm))
            sessions = _sessions(spec, seed)
            compiled = await target.compile_seconds()
            start = time.perf_counter()
            records = await run_sessions(
                target, sessions, concurrency=concurrency, request_rate=args.request_rate, seed=seed
            )
            wall = time.perf_counter() - start
            return summary(records, wall) | {"compile_s": await target.compile_seconds() - compiled}
        finally:
            await target.close()

    result = asyncio.run(measure())
    pace = f"concurrency {concurrency}" if concurrency else f"{args.request_rate} req/s"
    print(f"jmamba bench: {args.workload}, {pace}, seed {seed}")
    print(table(result))
    if result["compile_s"] > 0:
        print(
            f"note: {result['compile_s']:.1f} s of the run compiled step variants first used in it "
            "(start the server with --warmup all to compile every variant before measuring)"
        )
    if args.json:
        Path(args.json).write_text(json.dumps(result | {"seed": seed}, indent=1))
    return 0


async def _target(args: argparse.Namespace):
    """(the target, its max_model_len)."""
    from runtime.bench.targets import EngineTarget, HttpTarget

    if args.url is not None:
        http = HttpTarget(args.url)
        models = (await http.client.get(f"{http.url}/v1/models")).json()
        return http, int(models["data"][0]["max_model_len"])
    from runtime.llm import LLM  # loads jax: after the arguments are known to be good

    llm = LLM(args.model, **engine_options(args))
    if llm.tokenizer is None:
        raise ValueError(f"{args.model!r} has no tokenizer: the bench sends text")
    engine = EngineTarget(llm)
    engine.start()
    return engine, llm.engine.config.max_model_len


def _spec(args: argparse.Namespace, max_model_len: int):
    from runtime.bench.workloads import WorkloadSpec

    return WorkloadSpec.within(
        args.workload,
        args.num_requests,
        max_model_len,
        prompt_chars=args.prompt_chars,
        answer_tokens=args.answer_tokens,
        turns=args.turns,
    )


def _sessions(spec, seed: int):
    from runtime.bench.workloads import sessions

    return sessions(spec, seed)


def _warmup_sessions(spec, seed: int):
    import dataclasses

    from runtime.bench.workloads import sessions

    warm = dataclasses.replace(spec, num_requests=WARMUP_REQUESTS * spec.turns)
    return sessions(warm, seed + 1)
