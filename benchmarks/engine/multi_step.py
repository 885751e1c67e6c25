"""Multi-step decode (`EngineArgs.decode_steps`): a decode step's wall time against its memory
roofline, a step a program and N steps a program, on the bench models of the `decode` bench.

Per batch size B, on one compiled runner: the synchronous engine (a step a program), the
asynchronous engine (step N + 1 built while N runs), and the asynchronous engine running each N
of `--decode-steps` steps a program. Each row gives the wall time per decode step (a call of
`Engine.step()` over the decode steps it ran), decode tokens/s, host ms per step, the roofline
(bytes the step must move over the bandwidth measured in the same run: `decode`'s) and the
ratio, the seconds spent compiling the programs of N steps apart from the run, and whether its
greedy tokens so far equal the synchronous engine's (the same prompts; bf16 weights).

    python -m benchmarks.engine multi_step --size tiny --batches 1,4 --decode-steps 4  # CPU
    python -m benchmarks.engine multi_step --size 1b                                   # GPU
    python -m benchmarks.engine multi_step --size qwen3next --batches 1,16             # GPU
"""

from __future__ import annotations

import argparse
import json
import os

import jax

from benchmarks.harness.models import SIZES, bench_model
from benchmarks.harness.roofline import measure_bandwidth, step_bytes
from benchmarks.harness.serving import PROMPT_LEN, make_engine, time_steps
from jmamba import HybridLM
from runtime.device.placement import ParamSource
from runtime.engine import Engine


def bench_batch(
    model: HybridLM,
    batch: int,
    steps: int,
    decode_steps: list[int],
    bandwidth: float,
    params: ParamSource,
) -> list[dict]:
    """One row per way of running B decodes: synchronous, asynchronous, then asynchronous with
    each N of `decode_steps` steps a program (all on the first engine's compiled runner)."""
    first = make_engine(model, batch, steps, params=params)
    moved = step_bytes(model, first, batch, PROMPT_LEN + 4 + steps // 2)
    roofline_s = sum(moved.values()) / bandwidth
    ways = [(False, 1), (True, 1), *((True, n) for n in decode_steps)]
    rows, first_tokens = [], None
    for async_scheduling, n in ways:
        engine = first
        if (async_scheduling, n) != (False, 1):
            engine = make_engine(
                model,
                batch,
                steps,
                async_scheduling=async_scheduling,
                runner=first.runner,
                decode_steps=n,
            )
        compiled = sum(t for k, t in first.runner.compile_seconds.items() if k.steps == n)
        step_s, host_s, _ = time_steps(engine, steps)
        tokens = outputs_so_far(engine)
        first_tokens = first_tokens or tokens
        rows.append(
            dict(
                batch=batch,
                async_scheduling=async_scheduling,
                decode_steps=n,
                step_ms=1e3 * step_s,
                tokens_per_s=batch / step_s,
                host_ms=1e3 * host_s,
                roofline_ms=1e3 * roofline_s,
                x_roofline=step_s / roofline_s,
                compile_s=round(compiled, 1),
                same_tokens=agree(tokens, first_tokens),
            )
        )
        print(json.dumps(rows[-1]), flush=True)
    return rows


def outputs_so_far(engine: Engine) -> dict[str, list[int]]:
    """Each running request's output tokens so far (greedy: the same prompts in every engine)."""
    return {r.request_id: list(r.output_token_ids) for s in engine.schedulers for r in s.running}


def agree(tokens: dict[str, list[int]], reference: dict[str, list[int]]) -> bool:
    """Whether every request's tokens equal the reference engine's as far as both went."""
    return all(tokens[rid][: len(ref)] == ref[: len(tokens[rid])] for rid, ref in reference.items())


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", choices=SIZES, default="1b")
    parser.add_argument("--batches", default="1,16,64,256")
    parser.add_argument("--decode-steps", default="4,8", help="N of the multi-step rows")
    parser.add_argument("--steps", type=int, default=48, help="decode steps timed a row")
    args = parser.parse_args(argv)
    model, params = bench_model(args.size)
    bandwidth = measure_bandwidth()
    print(
        f"device={jax.devices()[0].device_kind} model={args.size} "
        f"bandwidth={bandwidth / 1e9:.0f} GB/s",
        flush=True,
    )
    decode_steps = [int(n) for n in args.decode_steps.split(",")]
    rows = []
    for batch in (int(b) for b in args.batches.split(",")):
        rows += bench_batch(model, batch, args.steps, decode_steps, bandwidth, params)
    result = {"size": args.size, "bandwidth": bandwidth, "rows": rows}
    if os.environ.get("OUT"):
        with open(os.path.join(os.environ["OUT"], f"multi_step_{args.size}.json"), "w") as f:
            json.dump(result, f, indent=1)
    print_table(rows)
    return result


def print_table(rows: list[dict]) -> None:
    print("batch  async  N   step_ms    tok/s  host_ms  roofline_ms  x_roofline  compile_s  same")
    for r in rows:
        print(
            f"{r['batch']:5d}  {r['async_scheduling']!s:5}  {r['decode_steps']:2d} "
            f"{r['step_ms']:8.3f} {r['tokens_per_s']:8.0f} {r['host_ms']:8.3f} "
            f"{r['roofline_ms']:11.3f} {r['x_roofline']:10.2f} {r['compile_s']:10.1f}  "
            f"{r['same_tokens']}"
        )
