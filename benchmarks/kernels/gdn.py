"""Gated DeltaNet decode on the GPU: correctness vs the jnp reference, timings beside FLA 0.6.0.

Qwen3-Next shapes: 16 key heads, 32 value heads, head dim 128, fp32 V-first state [S, HV, V, K],
bf16 activations. Three parts, run as separate processes (JAX and torch do not share the GPU well):
    python -m benchmarks.kernels gdn jax   OUT/jax.json    # checks + sweeps + timings (JAX)
    python -m benchmarks.kernels gdn fla   OUT/fla.json    # FLA anchors (torch + triton)
    python -m benchmarks.kernels gdn table OUT/jax.json OUT/fla.json
The prefill kernel (`gdn_chunk`) is checked by `gpu_checks.py` and timed beside FLA by the
`prefill` bench; this file's prefill parts were removed when their loop was found to run the
intra kernel once per loop instead of once per call.
JAX timings: jitted, warm, median of many; decode runs many calls inside one jitted fori_loop,
cycling through state pools larger than L2, the host's round trip of a timing cancelled
(`decode_loop_seconds`); FLA's do_bench flushes L2 before each rep.
FLA timings: triton.testing.do_bench (CUDA graph where capture works), and at B >= 64 also an
eager loop over four state tensors, timed as the JAX part times ours.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

HK, HV, D = 16, 32, 128
DECODE_B = (1, 16, 64, 256)
# FLA's decode as the anchor runs it: the final state written, l2norm in the kernel, V-first.
FLA_DECODE_OPTIONS = dict(output_final_state=True, use_qk_l2norm_in_kernel=True, state_v_first=True)


def state_bytes(n: int) -> int:
    return 2 * n * HV * D * D * 4  # read + write, fp32


def decode_loop_seconds(update, batch: int, reps: int = 5) -> float:
    """Seconds per call of `update(pool) -> pool` (a decode update of `batch` rows over a state
    pool of `batch` + 1 slots), timed as this file times ours: many calls in one jitted
    fori_loop, rotating over pools whose sum passes L2, the host's round trip cancelled
    (`benchmarks.harness.timing.device_seconds`)."""
    import jax
    import jax.numpy as jnp

    from benchmarks.harness.timing import device_seconds

    pool_bytes = (batch + 1) * HV * D * D * 4
    num_pools = max(2, -(-(64 << 20) // pool_bytes))  # > 50 MB L2
    pools = tuple(jnp.zeros((batch + 1, HV, D, D), jnp.float32) for _ in range(num_pools))
    n = max(4, 2048 // (batch * num_pools))

    def body(i, pools):
        return tuple(update(p) for p in pools)

    loop = jax.jit(lambda pools: jax.lax.fori_loop(0, n, body, pools), donate_argnums=0)
    return device_seconds(loop, pools, reps) / (n * num_pools)


# ----------------------------------------------------------------------------------------- JAX
def jax_part(out_path: str) -> None:
    import functools

    import jax
    import jax.numpy as jnp
    import numpy as np

    from benchmarks.harness.timing import copy_bandwidth
    from pallas_kernels.gdn.reference import gdn_state_update_reference
    from pallas_kernels.gdn.state_update import gdn_state_update

    res: dict = {"device": str(jax.devices()[0].device_kind), "decode": {}}
    rng = np.random.default_rng(0)
    bf = jnp.bfloat16

    def rnd(*s, dtype=bf):
        return jnp.asarray(rng.standard_normal(s, np.float32)).astype(dtype)

    res["copy_TBps"] = copy_bandwidth()  # read + write
    print(f"copy bandwidth {res['copy_TBps']:.2f} TB/s", flush=True)

    def rms_ratio(a, b):
        a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
        return float(np.sqrt(np.mean((a - b) ** 2)) / (np.sqrt(np.mean(b**2)) + 1e-30))

    # ---------------------------------------------------------------- decode
    def decode_inputs(B, L=1):
        q, k = rnd(B, L, HK, D), rnd(B, L, HK, D)
        v = rnd(B, L, HV, D)
        a, b = rnd(B, L, HV), rnd(B, L, HV)
        A_log = jnp.asarray(rng.uniform(0, 2, HV).astype(np.float32))
        dtb = rnd(HV, dtype=jnp.float32)
        rs = jnp.arange(1, B + 1, dtype=jnp.int32)
        ws = rs[:, None] if L == 1 else (B + 1 + jnp.arange(B * L, dtype=jnp.int32)).reshape(B, L)
        return (q, k, v, a, b, A_log, dtb), rs, ws

    # correctness: B=16 with one padding row, and K=3 drafts
    for B, L in ((16, 1), (8, 4)):
        ins, rs, ws = decode_inputs(B, L)
        rs = rs.at[3].set(0)
        ws = ws.at[3].set(0)
        S = 2 + B * (L + 1)
        st = rnd(S, HV, D, D, dtype=jnp.float32) * 0.1
        st = st.at[0].set(jnp.nan)
        o1, s1 = jax.jit(gdn_state_update)(*ins, st, rs, ws)
        o2, s2 = jax.jit(gdn_state_update_reference)(*ins, st, rs, ws)
        ok0 = bool(jnp.isnan(s1[0]).all())
        res["decode"][f"check_B{B}_L{L}"] = {
            "rms_o": rms_ratio(o1.astype(jnp.float32), o2.astype(jnp.float32)),
            "rms_state": rms_ratio(s1[1:], s2[1:]),
            "null_untouched": ok0,
        }
        print("decode check", B, L, res["decode"][f"check_B{B}_L{L}"], flush=True)

    def time_decode(B, **knobs):
        ins, rs, ws = decode_inputs(B)
        kern = functools.partial(gdn_state_update, **knobs)
        return decode_loop_seconds(lambda pool: kern(*ins, pool, rs, ws)[1], B)

    sweep = [dict(block_v=bv, num_warps=nw) for bv in (8, 16, 32, 64, 128) for nw in (1, 2, 4, 8)]
    for B in DECODE_B:
        best = None
        for kn in sweep:
            try:
                t = time_decode(B, **kn)
            except Exception as e:  # a config that fails to compile is skipped, and said so
                print("decode config failed", B, kn, repr(e)[:200], flush=True)
                continue
            print(f"decode B={B} {kn} {t * 1e6:.1f} us", flush=True)
            if best is None or t < best[0]:
                best = (t, kn)
        res["decode"][f"best_knobs_{B}"] = best[1]
        res["decode"][str(B)] = {
            "us": best[0] * 1e6,
            "knobs": best[1],
            "roofline_pct": 100 * state_bytes(B) / (res["copy_TBps"] * 1e12) / best[0],
        }

    for B in DECODE_B:
        res["decode"].pop(f"best_knobs_{B}", None)
    with open(out_path, "w") as fh:
        json.dump(res, fh, indent=1, default=str)


# ----------------------------------------------------------------------------------------- FLA
def fla_part(out_path: str) -> None:
    import functools

    import torch
    import torch.nn.functional as F
    import triton
    from fla.ops.gated_delta_rule import fused_recurrent_gated_delta_rule

    dev = "cuda"
    res: dict = {"decode": {}}

    def graph_bench(fn):
        fn()
        torch.cuda.synchronize()
        try:
            s = torch.cuda.Stream()
            s.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(s):
                fn()
            torch.cuda.current_stream().wait_stream(s)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                fn()
            return triton.testing.do_bench(graph.replay, warmup=50, rep=300), "graph"
        except Exception as e:  # capture fails for some paths: eager timing, and say so
            print("graph capture failed:", repr(e)[:200], flush=True)
            return triton.testing.do_bench(fn, warmup=50, rep=300), "eager"

    def loop_bench(calls) -> float:
        """Median microseconds per call of `calls` run back to back, eagerly, over several state
        tensors: how the JAX part times ours (its state pools beyond L2, one timing per pass over
        all of them). Host-bound at small B, so only taken where a call's kernel outlasts its
        launch."""
        for call in calls:
            call()
        torch.cuda.synchronize()
        times = []
        for _ in range(10):
            t0 = time.perf_counter()
            for call in calls:
                call()
            torch.cuda.synchronize()
            times.append(time.perf_counter() - t0)
        return statistics.median(times) / len(calls) * 1e6

    for B in DECODE_B:
        q = torch.randn(B, 1, HK, D, device=dev, dtype=torch.bfloat16)
        k = torch.randn(B, 1, HK, D, device=dev, dtype=torch.bfloat16)
        v = torch.randn(B, 1, HV, D, device=dev, dtype=torch.bfloat16)
        g = F.logsigmoid(torch.randn(B, 1, HV, device=dev))
        beta = torch.sigmoid(torch.randn(B, 1, HV, device=dev))
        h0 = torch.randn(B, HV, D, D, device=dev) * 0.1

        fn = functools.partial(
            fused_recurrent_gated_delta_rule,
            q,
            k,
            v,
            g=g,
            beta=beta,
            initial_state=h0,
            **FLA_DECODE_OPTIONS,
        )

        ms, how = graph_bench(fn)
        res["decode"][str(B)] = {"us": ms * 1e3, "how": how}
        print(f"FLA decode B={B}: {ms * 1e3:.1f} us ({how})", flush=True)
        if B >= 64:
            states = [h0] + [torch.randn_like(h0) * 0.1 for _ in range(3)]
            calls = [functools.partial(fn, initial_state=states[i % 4]) for i in range(32)]
            loop_us = loop_bench(calls)
            res["decode"][str(B)]["loop_us"] = loop_us
            print(f"FLA decode B={B}: {loop_us:.1f} us (eager loop over 4 states)", flush=True)

    with open(out_path, "w") as fh:
        json.dump(res, fh, indent=1)


# --------------------------------------------------------------------------------------- table
def _loop_column(loop_us: float | None, ours_us: float) -> str:
    return "-" if loop_us is None else f"{loop_us:.1f} us ({loop_us / ours_us:.2f}x)"


def table(jax_path: str, fla_path: str) -> None:
    ours = json.load(open(jax_path))
    try:
        fla = json.load(open(fla_path))
    except OSError:
        fla = {"decode": {}}
    bw = ours["copy_TBps"]
    lines = [
        f"device {ours['device']}, copy bandwidth {bw:.2f} TB/s (read+write)",
        "| op | shape | ours | FLA 0.6.0 | FLA/ours | FLA timed like ours "
        "| % of memory roofline (ours) | knobs |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for B in (b for b in DECODE_B if str(b) in ours["decode"]):
        o, a = ours["decode"][str(B)], fla["decode"].get(str(B), {})
        au = a.get("us")
        lines.append(
            f"| gdn_state_update | B={B} | {o['us']:.1f} us | "
            f"{'-' if au is None else f'{au:.1f} us'} | "
            f"{'-' if au is None else f'{au / o["us"]:.2f}x'} | "
            f"{_loop_column(a.get('loop_us'), o['us'])} | "
            f"{o['roofline_pct']:.0f}% | {o['knobs']} |"
        )
    checks = {k: v for k, v in ours["decode"].items() if k.startswith("check")}
    lines += [
        f"check {k}: o {v['rms_o']:.2e} state {v['rms_state']:.2e}" for k, v in checks.items()
    ]
    print("\n".join(lines))


PARTS = {"jax": (jax_part, 1), "fla": (fla_part, 1), "table": (table, 2)}  # part -> (run, paths)


def main(argv: list[str] | None = None) -> None:
    """`jax OUT.json`, `fla OUT.json` or `table JAX.json FLA.json`."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("part", choices=PARTS, help="jax and fla write a JSON; table reads both")
    parser.add_argument("paths", nargs="+", help="the part's JSON file(s)")
    args = parser.parse_args(argv)
    run, count = PARTS[args.part]
    if len(args.paths) != count:
        parser.error(f"{args.part} takes {count} path(s)")
    run(*args.paths)
