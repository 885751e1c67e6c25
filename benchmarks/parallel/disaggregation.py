"""Prefill/decode disaggregation on two GPUs of one host against one instance doing both: TTFT
and TPOT of a shared-prefix workload, the hand-over's bytes and times, greedy tokens compared.

Two processes (`disaggregation_sides.py`), each seeing one device (`CUDA_VISIBLE_DEVICES` as
`runtime.ranks.launch.rank_environment` sets it; one fake CPU device each on the CPU): the prefill
side on device 0, a `PrefillInstance`, hands every request over after its first token to the
decode side on device 1, a `DecodeInstance`, over the local `ConnectionTransport` (a socket
between the two; `--transport nixl`: `runtime.disagg.nixl.NixlTransport`). The baseline, one
engine prefilling and decoding every request, runs in the prefill side's process on device 0
with the same model, engine options and workload, before the P/D runs. This front process
touches no device.

Workload: `--requests` prompts sharing one random prefix of `--prefix-len` tokens, each with a
random tail of `--tail-len`, `--max-tokens` greedy tokens each (EOS ignored), all arriving at
once or at `--rate` requests/s; every engine runs `--concurrency` sequences at most (the rest
wait: in the engine's queue, or as hand-overs on the decode side) with a `--budget` token budget,
synchronous scheduling and prefix caching on the prefill side (`--prefix-caching`). Each mode
runs twice on the same runners (fresh engines, so fresh prefix caches): the first compiles
(`warm_s`, `compile_s`), the second is timed.

Per request: TTFT = arrival to the first token seen by the side that streams it (the decode side
for P/D: the hand-over's admission there, so export, send and admit are inside it); TPOT = the
mean time between its later tokens. Reported: p50 / p90 of both, throughput (generated tokens
over the first arrival to the last token), and per hand-over its wire bytes, export (rows read to
the host), send (until the transport holds it: over the local socket, until the decode side has
read it all, which it does between its steps), queued (received, waiting for a free sequence),
admit (check, blocks and slot, the scatter done on the device) and the whole hand-over (export
start to admitted). Greedy tokens of P/D against the baseline: the count of
requests that differ (and of failed ones) is printed, never hidden.

    python -m benchmarks.parallel disaggregation                                    # 2 GPUs
    python -m benchmarks.parallel disaggregation --model tiny --requests 3 --prefix-len 32 \\
        --tail-len 8 --max-tokens 4 --concurrency 4 --budget 128                    # CPU
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import json
import os
import socket
import subprocess
import sys
import time
from multiprocessing.connection import Connection
from typing import Any

import jax
import numpy as np

from benchmarks.parallel.disaggregation_sides import DECODE, PREFILL, Spec
from runtime.ranks.launch import rank_environment

SIDES = "benchmarks.parallel.disaggregation_sides"


@dataclasses.dataclass
class SideProcess:
    """A started side and the bench's end of its control socket."""

    role: str
    process: subprocess.Popen
    conn: Connection
    timeout: float

    def ask(self, command: str) -> None:
        self.conn.send(command)

    def answer(self) -> Any:
        """The side's next answer; RuntimeError if it ends or is silent for `timeout` s."""
        deadline = time.monotonic() + self.timeout
        while not self.conn.poll(1.0):
            if self.process.poll() is not None:
                raise RuntimeError(f"the {self.role} side ended (exit {self.process.returncode})")
            if time.monotonic() > deadline:
                raise RuntimeError(f"the {self.role} side sent nothing in {self.timeout} s")
        return self.conn.recv()


def start_side(spec: Spec, device: int, link: socket.socket, timeout: float) -> SideProcess:
    """Start `spec.role`'s process on device `device` and send it its spec."""
    front, child = socket.socketpair()
    env = rank_environment(device, 1, dict(os.environ))
    fds = [child.fileno(), link.fileno()]
    with child:
        process = subprocess.Popen(
            [sys.executable, "-m", SIDES, *map(str, fds)], env=env, pass_fds=fds
        )
    conn = Connection(front.detach())
    conn.send(dataclasses.asdict(spec))  # a dict: the side runs its module as __main__
    return SideProcess(spec.role, process, conn, timeout)


def percentiles(values: list[float], scale: float = 1e3) -> dict[str, float | None]:
    """p50 and p90 of `values` times `scale` (None when there are none)."""
    if not values:
        return dict(p50=None, p90=None)
    p50, p90 = np.percentile(np.asarray(values) * scale, [50, 90])
    return dict(p50=float(p50), p90=float(p90))


def latencies(start: float, arrivals: dict, tokens: dict, times: dict) -> dict[str, Any]:
    """TTFT, TPOT (ms) and throughput of one run's requests."""
    done = [r for r in arrivals if times.get(r)]
    ttft = [times[r][0] - arrivals[r] for r in done]
    tpot = [(times[r][-1] - times[r][0]) / (len(times[r]) - 1) for r in done if len(times[r]) > 1]
    generated = sum(len(tokens[r]) for r in done)
    seconds = max((times[r][-1] for r in done), default=start) - start
    return dict(
        requests=len(done),
        generated=generated,
        seconds=seconds,
        tokens_per_s=generated / seconds if seconds > 0 else 0.0,
        ttft_ms=percentiles(ttft),
        tpot_ms=percentiles(tpot),
    )


def handovers(prefill: dict, decode: dict) -> dict[str, Any]:
    """Per hand-over bytes and times (ms) of one P/D run."""
    sends, exports, admits = prefill["sends"], prefill["exports"], decode["admits"]
    ids = [r for r in sends if r in admits]
    return dict(
        count=len(ids),
        wire_bytes=float(np.mean([sends[r][2] for r in ids])) if ids else None,
        row_bytes=float(np.mean([sends[r][3] for r in ids])) if ids else None,
        export_ms=percentiles([exports[r][1] - exports[r][0] for r in ids]),
        send_ms=percentiles([sends[r][1] - sends[r][0] for r in ids]),
        admit_ms=percentiles([admits[r][1] - admits[r][0] for r in ids]),
        queued_ms=percentiles([admits[r][0] - decode["received"][r] for r in ids]),
        whole_ms=percentiles([admits[r][1] - exports[r][0] for r in ids]),
    )


def baseline_row(warm: dict, timed: dict) -> dict[str, Any]:
    """The baseline's row: the timed run's latencies, the warm run's cost (and what the timed
    run compiled: nothing, when the warm run did its job)."""
    row = latencies(timed["start"], timed["arrivals"], timed["tokens"], timed["times"])
    warm_s = max(max(t) for t in warm["times"].values()) - warm["start"]
    return dict(
        mode="one",
        **row,
        warm_s=warm_s,
        compile_s=warm["compile_s"],
        timed_compile_s=timed["compile_s"],
        failed=0,
        errors=[],
    )


def pd_row(warm: tuple[dict, dict], timed: tuple[dict, dict]) -> dict[str, Any]:
    """The P/D row: the timed run's latencies and hand-overs, the warm run's cost."""
    (prefill, decode), (warm_p, warm_d) = timed, warm
    row = latencies(prefill["start"], prefill["arrivals"], decode["tokens"], decode["times"])
    warm_s = max((max(t) for t in warm_d["times"].values()), default=0.0) - warm_p["start"]
    failed = set(prefill["failed"]) | set(decode["failed"])
    return dict(
        mode="P/D",
        **row,
        warm_s=warm_s,
        compile_s=warm_p["compile_s"] + warm_d["compile_s"],
        timed_compile_s=prefill["compile_s"] + decode["compile_s"],
        failed=len(failed),
        errors=sorted({*prefill["failed"].values(), *decode["failed"].values()})[:5],
        handover=handovers(prefill, decode),
    )


def run_both(sides: dict[str, SideProcess]) -> tuple[dict, dict]:
    """One P/D run: the decode side listens first, then the prefill side serves."""
    sides[DECODE].ask("pd")
    sides[PREFILL].ask("pd")
    return sides[PREFILL].answer(), sides[DECODE].answer()


def measure(specs: dict[str, Spec], timeout: float) -> tuple[list[dict], dict, dict]:
    """Start both sides, run the baseline twice, then P/D twice; (ready records, baseline's
    runs, P/D's runs). The baseline's warm run overlaps the decode side's start; nothing timed
    does."""
    prefill_link, decode_link = socket.socketpair()
    sides: dict[str, SideProcess] = {}
    try:
        with prefill_link, decode_link:
            sides[PREFILL] = start_side(specs[PREFILL], 0, prefill_link, timeout)
            sides[DECODE] = start_side(specs[DECODE], 1, decode_link, timeout)
        ready, one = [sides[PREFILL].answer()], []
        for _ in range(2):
            sides[PREFILL].ask("baseline")
            one.append(sides[PREFILL].answer())
            if len(ready) == 1:
                ready.append(sides[DECODE].answer())
        print(json.dumps(ready), flush=True)
        pd = [run_both(sides) for _ in range(2)]
        for side in sides.values():
            side.ask("stop")
            side.process.wait(timeout=60)
    finally:
        for side in sides.values():
            if side.process.poll() is None:
                side.process.kill()
            side.conn.close()
    return ready, dict(warm=one[0], timed=one[1]), dict(warm=pd[0], timed=pd[1])


def mismatches(ids: list[str], one: dict, pd: dict) -> int:
    """Requests whose greedy tokens differ between P/D and the baseline (failed ones too)."""
    return sum(one["tokens"].get(r) != pd["tokens"].get(r) for r in ids)


def ms(value: float | None, width: int = 0) -> str:
    """A millisecond figure for the table ("-" where there is none)."""
    return f"{'-' if value is None else f'{value:.2f}':>{width}s}"


def report(rows: list[dict], result: dict) -> None:
    """Print the table, the hand-over line and the tokens' verdict."""
    print("mode  TTFT ms p50 / p90   TPOT ms p50 / p90   tokens/s  seconds  warm s  compile s")
    for r in rows:
        ttft, tpot = r["ttft_ms"], r["tpot_ms"]
        print(
            f"{r['mode']:4s} {ms(ttft['p50'], 9)} / {ms(ttft['p90'], 8)} "
            f"{ms(tpot['p50'], 9)} / {ms(tpot['p90'], 8)} {r['tokens_per_s']:9.0f} "
            f"{r['seconds']:8.3f} {r['warm_s']:7.2f} {r['compile_s']:10.2f}"
        )
    h = rows[1]["handover"]
    size = "-" if h["wire_bytes"] is None else f"{h['wire_bytes'] / 1e6:.3f}"
    print(
        f"hand-over: {size} MB a request; export {ms(h['export_ms']['p50'])}, send "
        f"{ms(h['send_ms']['p50'])}, queued {ms(h['queued_ms']['p50'])}, admit "
        f"{ms(h['admit_ms']['p50'])}, whole {ms(h['whole_ms']['p50'])} ms (p50; whole p90 "
        f"{ms(h['whole_ms']['p90'])})"
    )
    print(
        f"greedy tokens: {result['token_mismatches']} of {result['args']['requests']} requests "
        f"differ between P/D and one instance; {rows[1]['failed']} failed"
    )
    timed = ", ".join(f"{r['mode']} {r['timed_compile_s']:.2f} s" for r in rows)
    print(f"compiled inside the timed runs: {timed}")
    for error in rows[1]["errors"]:
        print(f"  failed: {error}")


def side_specs(args: argparse.Namespace) -> dict[str, Spec]:
    """The two sides' specs of the parsed flags."""
    fields = {f.name for f in dataclasses.fields(Spec)} - {"role"}
    common = {k: v for k, v in vars(args).items() if k in fields}
    return {role: Spec(role=role, **common) for role in (PREFILL, DECODE)}


def parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="1b", help="a bench size, preset or checkpoint")
    parser.add_argument("--requests", type=int, default=64)
    parser.add_argument("--prefix-len", type=int, default=2048, help="shared prompt prefix")
    parser.add_argument("--tail-len", type=int, default=128, help="each prompt's own tokens")
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--rate", type=float, default=0.0, help="requests/s; 0: all at once")
    parser.add_argument("--concurrency", type=int, default=16, help="max_num_seqs per engine")
    parser.add_argument("--budget", type=int, default=4096, help="token budget per step")
    parser.add_argument("--prefix-caching", choices=["off", "align", "all"], default="all")
    parser.add_argument("--batch-invariant", action="store_true")
    parser.add_argument("--transport", choices=["local", "nixl"], default="local")
    parser.add_argument("--lost-after-s", type=float, default=300.0, help="a hand-over's wait")
    parser.add_argument("--timeout", type=float, default=540.0, help="a side's longest silence")
    args = parser.parse_args(argv)
    if args.transport == "nixl" and importlib.util.find_spec("nixl") is None:
        parser.error("--transport nixl: the nixl package does not import here (pip install nixl)")
    return args


def main(argv: list[str] | None = None) -> dict:
    args = parse(argv)
    jax.config.update("jax_platforms", "cpu")  # this process touches no GPU: the sides do
    specs = side_specs(args)
    start = time.perf_counter()
    ready, one, pd = measure(specs, args.timeout)
    rows = [baseline_row(one["warm"], one["timed"]), pd_row(pd["warm"], pd["timed"])]
    pd_decode = pd["timed"][1]
    result = dict(
        args=vars(args),
        sides=ready,
        rows=rows,
        token_mismatches=mismatches(specs[PREFILL].ids, one["timed"], pd_decode),
        wall_s=time.perf_counter() - start,
    )
    if os.environ.get("OUT"):
        with open(os.path.join(os.environ["OUT"], "bench_disaggregation.json"), "w") as f:
            json.dump(result, f, indent=1)
    report(rows, result)
    return result


if __name__ == "__main__":
    main()
