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

    python -m benchmarks.engine decode --size tiny --batches 1,4 --contexts 64   # CPU smoke test
    python -m benchmarks.engine decode --size 1b --contexts 8192,32768           # GPU
    python -m benchmarks.engine decode --size qwen3next --contexts 8192,32768    # GPU
"""

from __future__ import annotations

import argparse
import json
import os

import jax
from flax import nnx

from benchmarks.engine.long_context import bench_context
from benchmarks.harness.models import SIZES, bench_model
from benchmarks.harness.roofline import measure_bandwidth, step_bytes
from benchmarks.harness.serving import PROMPT_LEN, make_engine, time_steps
from jmamba import HybridLM
from runtime.device.placement import ParamSource


def bench_batch(
    model: HybridLM, batch: int, steps: int, bandwidth: float, params: ParamSource
) -> dict:
    """The synchronous engine's step (host, device, roofline), then the asynchronous engine's
    step time on the same compiled steps (`async_step_ms`; its device time is only the wait for
    the previous step's tokens, so its host/device split is not comparable). The runner's
    parameters come from `params`."""
    engine = make_engine(model, batch, steps, params=params)
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


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
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
    parser.add_argument(
        "--weights",
        choices=("built", "drawn"),
        help="built: the model initialised whole, then placed by each runner (a copy); drawn: "
        "the model as shapes, its weights drawn on the device once (default: drawn for "
        "qwen3next, whose 41 GB twice does not fit an 80 GB H100; built for the others)",
    )
    args = parser.parse_args(argv)
    model, params = bench_model(
        args.size, None if args.weights is None else args.weights == "drawn"
    )
    num_params = sum(x.size for x in jax.tree.leaves(nnx.state(model, nnx.Param)))
    bandwidth = measure_bandwidth()
    print(
        f"device={jax.devices()[0].device_kind} model={args.size} "
        f"params={num_params / 1e9:.3f}B bandwidth={bandwidth / 1e9:.0f} GB/s",
        flush=True,
    )
    batches = [int(b) for b in args.batches.split(",")]
    rows = []
    for batch in batches:
        rows.append(bench_batch(model, batch, args.steps, bandwidth, params))
        print(json.dumps(rows[-1]), flush=True)
    long_rows = []
    for context in (int(c) for c in args.contexts.split(",") if c):
        for batch in (b for b in batches if b * context <= args.max_context_tokens):
            long_rows.append(
                bench_context(
                    model, batch, context, args.steps, bandwidth, args.context_budget, params
                )
            )
            print(json.dumps(long_rows[-1]), flush=True)
    result = {"params": num_params, "bandwidth": bandwidth, "rows": rows, "long_context": long_rows}
    if os.environ.get("OUT"):
        with open(os.path.join(os.environ["OUT"], f"bench_engine_{args.size}.json"), "w") as f:
            json.dump(result, f, indent=1)
    print_tables(rows, long_rows)
    return result


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
