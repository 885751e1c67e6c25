"""`jmamba serve` on a bench model: start-up (cold and warm compile cache), then `jmamba bench`
workloads over HTTP beside the same workloads on an engine thread in this process (no HTTP: the
difference is the server's own cost).

    python -m benchmarks.serving serve --size 1b --concurrency 1,16,64 \
        --workloads random,shared-prefix --json /tmp/serve.json

The bench model (benchmarks/harness/models.py: `1b` is NemotronH-shaped, ~0.87B parameters, random
bf16 weights) is written as a checkpoint directory with the presets' byte-level tokenizer (the
workloads send text; generated ids above the tokenizer's 257 have no text, so time to first token
is taken at the first streamed chunk, see runtime/bench/targets.py). Start-up is measured from
launching `jmamba serve` to `/health` answering 200 ("ready"), then the first token of one
request; cold is an empty compile cache and step store, warm the same ones a second time, both
with `--warmup alone` (the default: decode steps and one prefill row alone). The bench's server
starts on the same caches with `--warmup all` (`--bench-warmup`): on the "serving" bucket table
(`--bucket-table`, jmamba serve's default) that is every program a step without top-k / top-p,
penalties or log-probabilities can run, so the measured run should compile nothing; the table
says how many compile seconds fell in it.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

from benchmarks.harness.suite import repo_on_path


def write_checkpoint(size: str, directory: Path) -> None:
    """The bench model `size` as a checkpoint directory (config, safetensors, tokenizer)."""
    from flax import nnx

    import jmamba
    from benchmarks.harness.models import hf_config
    from jmamba import HybridLM
    from jmamba.checkpoints.families.registry import from_hf_config
    from jmamba.checkpoints.weights import cast, save_pretrained

    config = hf_config(size)
    model = cast(HybridLM(from_hf_config(config), rngs=nnx.Rngs(0)), "bfloat16")
    save_pretrained(model, directory, config)
    shutil.copy(jmamba.presets.path("stdlib") / "tokenizer.json", directory / "tokenizer.json")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def get(url: str, timeout: float = 2.0) -> int:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as reply:
            return reply.status
    except OSError:
        return 0


def first_token_seconds(url: str) -> float:
    """Seconds to the first streamed chunk of one short completion."""
    with urllib.request.urlopen(f"{url}/v1/models", timeout=10) as reply:
        name = json.load(reply)["data"][0]["id"]
    body = json.dumps(
        {"model": name, "prompt": "def fibonacci(n):", "max_tokens": 4, "stream": True}
    ).encode()
    request = urllib.request.Request(
        f"{url}/v1/completions", body, {"Content-Type": "application/json"}
    )
    start = time.perf_counter()
    with urllib.request.urlopen(request, timeout=120) as reply:
        for line in reply:
            if line.startswith(b"data: {"):
                return time.perf_counter() - start
    raise RuntimeError("the server streamed no chunk")


class Server:
    """A `jmamba serve` subprocess on a free port, timed from launch to ready."""

    def __init__(self, model: Path, cache: Path, engine_args: list[str]) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        env = repo_on_path(dict(os.environ, JMAMBA_COMPILE_CACHE=str(cache)))
        command = [sys.executable, "-m", "runtime.cli", "serve", "--model", str(model)]
        command += ["--port", str(self.port), *engine_args]
        self.started = time.perf_counter()
        self.log = Path(tempfile.mkstemp(prefix="serve_", suffix=".log")[1])
        with self.log.open("w") as log:
            self.process = subprocess.Popen(command, env=env, stderr=log)

    def wait_ready(self, limit: float = 600.0) -> float:
        while time.perf_counter() - self.started < limit:
            if self.process.poll() is not None:
                tail = self.log.read_text()[-3000:]
                raise RuntimeError(f"jmamba serve exited with {self.process.returncode}:\n{tail}")
            if get(f"{self.url}/health") == 200:
                return time.perf_counter() - self.started
            time.sleep(0.05)
        raise RuntimeError(f"jmamba serve not ready after {limit} s")

    def stop(self) -> None:
        self.process.terminate()
        self.process.wait(30)


def start_up(model: Path, cache: Path, engine_args: list[str], label: str) -> Server:
    server = Server(model, cache, engine_args)
    ready = server.wait_ready()
    first = first_token_seconds(server.url)
    said = [line for line in server.log.read_text().splitlines() if "jmamba serve:" in line]
    print(f"start-up {label}: ready {ready:.1f} s, first token {first:.3f} s after ready")
    print("  " + "\n  ".join(said))
    RESULTS.setdefault("startup", {})[label] = {
        "ready_s": ready,
        "first_token_s": first,
        "server_said": said,
    }
    return server


async def run_workload(target, spec, concurrency: int, seed: int) -> dict[str, float]:
    """One bench run as `jmamba bench` does it, but with a whole rehearsal first: the same
    workload at the same concurrency with another seed, so the step shapes the run reaches are
    mostly compiled before it is timed (what still compiles is reported)."""
    from runtime.bench.report import summary
    from runtime.bench.runner import run_sessions
    from runtime.bench.workloads import sessions

    await run_sessions(target, sessions(spec, seed + 1), concurrency=concurrency)
    compiled = await target.compile_seconds()
    start = time.perf_counter()
    records = await run_sessions(target, sessions(spec, seed), concurrency=concurrency)
    result = summary(records, time.perf_counter() - start)
    return result | {"compile_s": await target.compile_seconds() - compiled}


async def bench_all(target, args, label: str) -> None:
    from runtime.bench.workloads import WorkloadSpec

    for workload in args.workloads.split(","):
        for concurrency in (int(c) for c in args.concurrency.split(",")):
            requests = args.num_requests or max(16, 4 * concurrency)
            spec = WorkloadSpec.within(workload, requests, args.max_model_len)
            result = await run_workload(target, spec, concurrency, seed=1234 + concurrency)
            RESULTS.setdefault("bench", []).append(
                {"target": label, "workload": workload, "concurrency": concurrency} | result
            )
            print(
                f"{label:7s} {workload:13s} c={concurrency:3d} n={requests:4d}  "
                f"ttft p50 {result['ttft_ms_p50']:7.1f} ms p99 {result['ttft_ms_p99']:7.1f}"
                f"  tpot p50 {result['tpot_ms_p50']:6.2f} ms  "
                f"{result['output_tokens_per_s']:8.1f} tok/s  {result['request_per_s']:6.2f} "
                f"req/s  compile in run {result['compile_s']:.1f} s",
                flush=True,
            )


async def bench_http(url: str, args) -> None:
    from runtime.bench.targets import HttpTarget

    target = HttpTarget(url)
    try:
        await bench_all(target, args, "http")
    finally:
        await target.close()


async def bench_engine(model: Path, cache: Path, args) -> None:
    os.environ["JMAMBA_COMPILE_CACHE"] = str(cache)
    from runtime.bench.targets import EngineTarget
    from runtime.llm import LLM

    llm = LLM(
        str(model),
        max_model_len=args.max_model_len,
        max_num_seqs=args.max_num_seqs,
        bucket_table=args.bucket_table,
    )
    target = EngineTarget(llm)
    target.start()
    try:
        await bench_all(target, args, "engine")
    finally:
        await target.close()


RESULTS: dict = {}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size", default="1b", help="bench model (benchmarks/harness/models.py)")
    parser.add_argument("--concurrency", default="1,16,64")
    parser.add_argument("--workloads", default="random,shared-prefix")
    parser.add_argument(
        "--num-requests", type=int, default=0, help="per run (0: max(16, 4 x concurrency))"
    )
    parser.add_argument("--max-model-len", type=int, default=2048)
    parser.add_argument("--max-num-seqs", type=int, default=64)
    parser.add_argument("--json", default=None)
    parser.add_argument("--work", default=None, help="checkpoint and caches (default: a temp dir)")
    parser.add_argument(
        "--parts",
        default="startup,bench,engine",
        help="startup (a cold start, then a warm one), bench (over HTTP), engine (the same in "
        "this process), one-compiler (a cold start compiling one variant at a time)",
    )
    parser.add_argument(
        "--bench-warmup",
        default="all",
        choices=["decode", "alone", "all"],
        help="the bench server's --warmup (all: every program it can run, 0 s compiled in the "
        "measured run)",
    )
    parser.add_argument(
        "--bucket-table",
        default="serving",
        choices=["fine", "serving"],
        help="the servers' --bucket-table",
    )
    args = parser.parse_args(argv)
    work = Path(args.work or tempfile.mkdtemp(prefix="bench_serve_"))
    model, cache = work / "model", work / "cache"
    if not (model / "config.json").is_file():
        # In a process of its own, on the CPU: JAX here would hold most of the GPU's memory (its
        # preallocation) for the rest of the run, and the server would run out of it.
        started = time.perf_counter()
        env = repo_on_path(dict(os.environ, JAX_PLATFORMS="cpu"))
        code = "import sys; from pathlib import Path; from benchmarks.serving.serve import "
        code += "write_checkpoint as w; w(sys.argv[1], Path(sys.argv[2]))"
        subprocess.run([sys.executable, "-c", code, args.size, str(model)], env=env, check=True)
        print(f"checkpoint {args.size} written in {time.perf_counter() - started:.1f} s")
    engine_args = ["--max-model-len", str(args.max_model_len)]
    engine_args += ["--max-num-seqs", str(args.max_num_seqs)]
    engine_args += ["--bucket-table", args.bucket_table]
    parts = args.parts.split(",")
    if "one-compiler" in parts:
        one = engine_args + ["--compile-workers", "1"]
        start_up(model, work / "cache_one_worker", one, "cold, 1 compiler").stop()
    if "startup" in parts:
        start_up(model, cache, engine_args, "cold").stop()
        start_up(model, cache, engine_args, "warm").stop()
    if "bench" in parts:
        warmup = ["--warmup", args.bench_warmup]
        server = start_up(model, cache, engine_args + warmup, f"--warmup {args.bench_warmup}")
        try:
            asyncio.run(bench_http(server.url, args))
        finally:
            server.stop()
            failures = server.log.read_text().split("engine step failed")
            if len(failures) > 1:  # the server's log holds the first failure's traceback
                print(f"the server failed {len(failures) - 1} steps; the first:")
                print(failures[1][:4000])
    if "engine" in parts:
        asyncio.run(bench_engine(model, cache, args))
    if args.json:
        Path(args.json).write_text(json.dumps(RESULTS, indent=1))
