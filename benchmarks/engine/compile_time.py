"""Cold compile time of the step programs a server warms, under compile settings, and what each
setting costs the steps it compiles.

Each setting runs in a child process of its own with no compilation cache and no step store
(every program compiles): the bench model's engine as `jmamba serve` builds it (the serving bucket
table, one sampler program, asynchronous, 4 decode steps a program, `--max-num-seqs 64
--max-model-len 2048`), `Engine.warmup(prefill="alone", sampled=True, workers=W)` timed (wall
seconds, and each program's own lowering + compile seconds), then B = 16 decode steps timed on
the compiled programs (wall ms a step, a program of 4 each), so a setting that compiles faster
but runs slower shows it. A setting is `w<W>` (compiler threads) with `+<name>` XLA options
from `XLA_OPTIONS`, or `+cache` (filling an empty compilation cache and step store).

    python -m benchmarks.engine compile_time --size 1b                      # GPU
    python -m benchmarks.engine compile_time --size tiny --settings w2 --max-num-seqs 4  # CPU
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

from benchmarks.harness.suite import bench_command, repo_on_path
from benchmarks.harness.timing import log, record

SETTINGS = "w4,w8,w16,w8+autotune0"
# XLA options a setting may add (`+name`): what each trades is the question this bench asks.
XLA_OPTIONS = {
    "autotune0": "--xla_gpu_autotune_level=0",  # GEMMs take XLA's heuristic tiling, untimed
}
DECODE_BATCH = 16


def engine_args(max_num_seqs: int):
    from runtime.core.engine_args import EngineArgs

    return EngineArgs(
        max_num_seqs=max_num_seqs,
        max_model_len=2048,
        block_size=16,
        bucket_table="serving",
        one_sampler_program=True,
        async_scheduling=True,
        decode_steps=4,
    )


def measure(size: str, setting: str, steps: int, max_num_seqs: int) -> dict:
    """One setting in this process (its XLA options already in XLA_FLAGS)."""
    from benchmarks.harness.models import bench_model
    from benchmarks.harness.serving import PROMPT_LEN, time_steps
    from runtime.core.sampling_params import SamplingParams
    from runtime.device import compile_cache
    from runtime.engine import Engine

    compile_cache.enable()  # as `LLM` does (off unless the setting has `+cache`)
    workers = int(setting.split("+")[0].removeprefix("w"))
    model, params = bench_model(size)
    engine = Engine(model, engine_args(max_num_seqs), params=params)
    start = time.perf_counter()
    engine.warmup(prefill="alone", sampled=True, workers=workers)
    wall = time.perf_counter() - start
    seconds = sorted(engine.runner.compile_seconds.values())
    for i in range(min(DECODE_BATCH, max_num_seqs)):
        prompt = [(7 * i + t) % (model.config.vocab_size - 1) + 1 for t in range(PROMPT_LEN)]
        engine.add_request(prompt, SamplingParams(max_tokens=8 * steps + 64, ignore_eos=True))
    step_s, _, _ = time_steps(engine, steps)
    return dict(
        size=size,
        setting=setting,
        programs=len(seconds),
        warmup_s=round(wall, 2),
        program_s_sum=round(sum(seconds), 2),
        program_s_max=round(seconds[-1], 2),
        program_s_min=round(seconds[0], 2),
        decode_ms_b16=round(1e3 * step_s, 3),
    )


def child_env(setting: str) -> dict[str, str]:
    """The setting's environment: no caches (`+cache`: an empty compilation cache and step store
    that the warm-up fills, as a server's cold start does), its XLA options added to
    XLA_FLAGS."""
    names = setting.split("+")[1:]
    env = dict(os.environ, JMAMBA_COMPILE_CACHE="off", JMAMBA_STEP_STORE="off")
    env.pop("JAX_COMPILATION_CACHE_DIR", None)  # a cache given to JAX itself would load programs
    if "cache" in names:
        env |= dict(JMAMBA_COMPILE_CACHE=tempfile.mkdtemp(prefix="compile_time_"))
        env.pop("JMAMBA_STEP_STORE")
    options = [XLA_OPTIONS[name] for name in names if name != "cache"]
    env["XLA_FLAGS"] = " ".join(filter(None, [env.get("XLA_FLAGS", ""), *options]))
    return repo_on_path(env)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size", default="1b")
    parser.add_argument("--settings", default=SETTINGS)
    parser.add_argument("--steps", type=int, default=32, help="decode steps timed")
    parser.add_argument("--max-num-seqs", type=int, default=64)
    parser.add_argument("--one", default=None, help=argparse.SUPPRESS)  # a child's setting
    args = parser.parse_args(argv)
    if args.one is not None:
        row = measure(args.size, args.one, args.steps, args.max_num_seqs)
        print("ROW " + json.dumps(row), flush=True)
        return
    for setting in args.settings.split(","):
        flags = ["--size", args.size, "--steps", str(args.steps), "--one", setting]
        flags += ["--max-num-seqs", str(args.max_num_seqs)]
        command = bench_command("benchmarks.engine", "compile_time", *flags)
        done = subprocess.run(command, env=child_env(setting), capture_output=True, text=True)
        rows = [line[4:] for line in done.stdout.splitlines() if line.startswith("ROW ")]
        if done.returncode or not rows:
            log(f"{setting}: exit {done.returncode}\n{done.stderr[-3000:]}")
            continue
        record(**json.loads(rows[0]))


if __name__ == "__main__":
    main(sys.argv[1:])
