"""Where the host time of a data-parallel bench run goes: `bench_data_parallel.py`'s workload at
one rank count, served once to warm up, then once under cProfile; prints the functions with the
most own time and the most cumulative time, and the engine's host / device ms per step.

Made for the DP = 1 rows of bench_data_parallel.py, whose host time per step (8.4-9.6 ms on the
H100 / H200) was twice that of two ranks together.

    python benchmarks/probe_dp_host.py --ranks 1 --async-scheduling
"""

from __future__ import annotations

import argparse
import cProfile
import io
import os
import pstats
import sys

if __package__ in (None, ""):  # run as `python benchmarks/<script>.py`: the repo root on the path
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks.bench_data_parallel import (  # noqa: E402
    add_workload_arguments,
    engine_config,
    serve,
    workload,
)
from runtime.device.model_runner import ModelRunner  # noqa: E402
from runtime.engine import Engine  # noqa: E402


def main(argv: list[str] | None = None) -> pstats.Stats:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_workload_arguments(parser)
    parser.add_argument("--ranks", type=int, default=1)
    parser.add_argument("--top", type=int, default=25)
    args = parser.parse_args(argv)
    model, prompts, max_len = workload(args)
    config = engine_config(args.ranks, args.seqs, args.budget, max_len, args.async_scheduling)
    runner = ModelRunner(model, config)
    serve(Engine(model, config, runner=runner), prompts, args.max_tokens)  # compiles, warms
    engine = Engine(model, config, runner=runner)
    profile = cProfile.Profile()
    profile.enable()
    seconds, generated = serve(engine, prompts, args.max_tokens)
    profile.disable()
    stats = engine.stats
    print(
        f"ranks={args.ranks}: {generated / seconds:.0f} tokens/s, {stats.num_steps} steps, host "
        f"{1e3 * stats.host_seconds / stats.num_steps:.2f} ms/step, device "
        f"{1e3 * stats.device_seconds / stats.num_steps:.2f} ms/step (under cProfile)"
    )
    for key in ("tottime", "cumulative"):
        text = io.StringIO()
        pstats.Stats(profile, stream=text).sort_stats(key).print_stats(args.top)
        print(text.getvalue())
    return pstats.Stats(profile)


if __name__ == "__main__":
    main()
