"""Gated DeltaNet kernels on the GPU: correctness vs the jnp references, timings beside FLA 0.6.0.

Qwen3-Next shapes: 16 key heads, 32 value heads, head dim 128, fp32 V-first state [S, HV, V, K],
bf16 activations. Three parts, run as separate processes (JAX and torch do not share the GPU well):
    python benchmarks/bench_gdn_kernels.py jax   OUT/jax.json    # checks + sweeps + timings (JAX)
    python benchmarks/bench_gdn_kernels.py fla   OUT/fla.json    # FLA anchors (torch + triton)
    python benchmarks/bench_gdn_kernels.py table OUT/jax.json OUT/fla.json
    python benchmarks/bench_gdn_kernels.py prefill OUT/jax.json  # prefill: checks, sweep, intra
JAX timings: jitted, warm, median of many; decode runs many calls inside one jitted fori_loop,
cycling through state pools larger than L2 (FLA's do_bench flushes L2 before each rep).
FLA timings: triton.testing.do_bench (CUDA graph where capture works).
"""

from __future__ import annotations

import json
import sys
import time

HK, HV, D = 16, 32, 128
DECODE_B = (1, 16, 64, 256)
PREFILL = {"1x8192": (8192,), "8x2048": (2048,) * 8, "1x32768": (32768,)}


def state_bytes(n: int) -> int:
    return 2 * n * HV * D * D * 4  # read + write, fp32


def prefill_min_bytes(lengths) -> int:
    T = sum(lengths)
    per_tok = (2 * HK * D + 2 * HV * D) * 2 + 2 * HV * 2  # q, k, v, o bf16; g, beta
    return T * per_tok + state_bytes(len(lengths))


# ----------------------------------------------------------------------------------------- JAX
def jax_part(out_path: str) -> None:
    import functools

    import jax
    import jax.numpy as jnp
    import numpy as np

    from pallas_kernels.gdn_chunk import gdn_chunk
    from pallas_kernels.gdn_reference import gdn_chunk_reference, gdn_state_update_reference
    from pallas_kernels.gdn_state_update import gdn_state_update

    res: dict = {"device": str(jax.devices()[0].device_kind), "decode": {}, "prefill": {}}
    rng = np.random.default_rng(0)
    bf = jnp.bfloat16

    def rnd(*s, dtype=bf):
        return jnp.asarray(rng.standard_normal(s, np.float32)).astype(dtype)

    def median_time(f, *args, reps=30, carry=None):
        out = f(*args)
        jax.block_until_ready(out)
        ts = []
        for _ in range(reps):
            t0 = time.perf_counter()
            out = f(*args)
            jax.block_until_ready(out)
            ts.append(time.perf_counter() - t0)
        return float(np.median(ts))

    # copy bandwidth (read + write)
    x = jnp.ones((256 * 1024 * 1024,), jnp.float32)
    cp = jax.jit(lambda x: x + 1.0)
    t = median_time(cp, x, reps=20)
    res["copy_TBps"] = 2 * x.size * 4 / t / 1e12
    del x
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
        pool_bytes = (B + 1) * HV * D * D * 4
        NL = max(2, -(-(64 << 20) // pool_bytes))  # > 50 MB L2
        pools = tuple(jnp.zeros((B + 1, HV, D, D), jnp.float32) for _ in range(NL))
        n = max(4, 2048 // (B * NL))
        kern = functools.partial(gdn_state_update, **knobs)

        def loop(pools):
            def body(i, pools):
                return tuple(kern(*ins, p, rs, ws)[1] for p in pools)

            return jax.lax.fori_loop(0, n, body, pools)

        f = jax.jit(loop, donate_argnums=0)
        pools = f(pools)
        jax.block_until_ready(pools)
        ts = []
        for _ in range(10):
            t0 = time.perf_counter()
            pools = f(pools)
            jax.block_until_ready(pools)
            ts.append(time.perf_counter() - t0)
        return float(np.median(ts)) / (n * NL)

    sweep = [dict(block_v=bv, num_warps=nw) for bv in (8, 16, 32, 64) for nw in (1, 4)]
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

    # ---------------------------------------------------------------- prefill
    def prefill_inputs(lengths, nc=None, hi=True):
        T, R = sum(lengths), len(lengths)
        q, k, v = rnd(T, HK, D), rnd(T, HK, D), rnd(T, HV, D)
        g = jax.nn.log_sigmoid(rnd(T, HV, dtype=jnp.float32))
        beta = jax.nn.sigmoid(rnd(T, HV, dtype=jnp.float32))
        qsl = jnp.asarray(np.concatenate([[0], np.cumsum(lengths)]), jnp.int32)
        nc = jnp.zeros((R,), jnp.int32) if nc is None else jnp.asarray(nc, jnp.int32)
        hi = jnp.full((R,), hi)
        rs = jnp.arange(1, R + 1, dtype=jnp.int32)
        return (q, k, v, g, beta), (qsl, nc, hi, rs, rs)

    # correctness: 8 rows, misaligned starts, mixed initial states, vs the token recurrence
    lengths = (300, 1, 64, 129, 700, 33, 2, 500)
    ins, meta = prefill_inputs(lengths, nc=(0, 5, 64, 100, 3, 63, 0, 1000), hi=True)
    meta = (meta[0], meta[1], jnp.asarray([0, 1, 1, 1, 0, 1, 1, 1], bool), meta[3], meta[4])
    st = rnd(len(lengths) + 1, HV, D, D, dtype=jnp.float32) * 0.1
    st = st.at[0].set(jnp.nan)
    o1, s1 = jax.jit(gdn_chunk)(*ins, st, *meta)
    o2, s2 = jax.jit(gdn_chunk_reference)(*ins, st, *meta)
    res["prefill"]["check_varlen"] = {
        "rms_o": rms_ratio(o1.astype(jnp.float32), o2.astype(jnp.float32)),
        "rms_state": rms_ratio(s1[1:], s2[1:]),
        "null_untouched": bool(jnp.isnan(s1[0]).all()),
        "finite": bool(jnp.isfinite(o1.astype(jnp.float32)).all()),
    }
    o3, s3 = jax.jit(functools.partial(gdn_chunk, inter_dtype=jnp.float32))(*ins, st, *meta)
    res["prefill"]["check_varlen_fp32_wy"] = {
        "rms_o": rms_ratio(o3.astype(jnp.float32), o2.astype(jnp.float32)),
        "rms_state": rms_ratio(s3[1:], s2[1:]),
    }
    print("prefill check", res["prefill"]["check_varlen"], flush=True)

    def time_prefill(lengths, **knobs):
        ins, meta = prefill_inputs(lengths)
        st = jnp.zeros((len(lengths) + 1, HV, D, D), jnp.float32)
        kern = functools.partial(gdn_chunk, **knobs)
        n = 4

        def loop(st):
            return jax.lax.fori_loop(0, n, lambda i, s: kern(*ins, s, *meta)[1], st)

        f = jax.jit(loop, donate_argnums=0)
        st = f(st)
        jax.block_until_ready(st)
        ts = []
        for _ in range(10):
            t0 = time.perf_counter()
            st = f(st)
            jax.block_until_ready(st)
            ts.append(time.perf_counter() - t0)
        return float(np.median(ts)) / n

    psweep = [dict(block_v=bv, num_warps=nw) for bv in (16, 32, 64) for nw in (4, 8)]
    psweep += [dict(block_v=32, num_warps=4, inter_dtype=jnp.float32)]
    for name, lengths in PREFILL.items():
        best = None
        for kn in psweep if name == "1x8192" else [res["prefill"]["best_knobs"]]:
            try:
                t = time_prefill(lengths, **kn)
            except Exception as e:
                print("prefill config failed", name, kn, repr(e)[:300], flush=True)
                continue
            print(f"prefill {name} {kn} {t * 1e3:.3f} ms", flush=True)
            if best is None or t < best[0]:
                best = (t, kn)
        if name == "1x8192":
            res["prefill"]["best_knobs"] = best[1]
        res["prefill"][name] = {
            "ms": best[0] * 1e3,
            "knobs": str(best[1]),
            "roofline_pct": 100 * prefill_min_bytes(lengths) / (res["copy_TBps"] * 1e12) / best[0],
        }
    res["prefill"]["best_knobs"] = str(res["prefill"]["best_knobs"])
    for B in DECODE_B:
        res["decode"].pop(f"best_knobs_{B}", None)
    with open(out_path, "w") as fh:
        json.dump(res, fh, indent=1, default=str)


# ----------------------------------------------------------------------------------------- FLA
def fla_part(out_path: str, only: str = "") -> None:
    import functools

    import torch
    import torch.nn.functional as F
    import triton
    from fla.ops.gated_delta_rule import chunk_gated_delta_rule, fused_recurrent_gated_delta_rule

    dev = "cuda"
    res: dict = {"decode": {}, "prefill": {}}

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

    for B in DECODE_B if not only else ():
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
            output_final_state=True,
            use_qk_l2norm_in_kernel=True,
            state_v_first=True,
        )

        ms, how = graph_bench(fn)
        res["decode"][str(B)] = {"us": ms * 1e3, "how": how}
        print(f"FLA decode B={B}: {ms * 1e3:.1f} us ({how})", flush=True)

    for name, lengths in PREFILL.items():
        if only and name not in only.split(","):
            continue
        T, N = sum(lengths), len(lengths)
        q = torch.randn(1, T, HK, D, device=dev, dtype=torch.bfloat16)
        k = torch.randn(1, T, HK, D, device=dev, dtype=torch.bfloat16)
        v = torch.randn(1, T, HV, D, device=dev, dtype=torch.bfloat16)
        g = F.logsigmoid(torch.randn(1, T, HV, device=dev))
        beta = torch.sigmoid(torch.randn(1, T, HV, device=dev))
        h0 = torch.randn(N, HV, D, D, device=dev) * 0.1
        cu = (
            torch.tensor(
                [0] + list(__import__("itertools").accumulate(lengths)),
                device=dev,
                dtype=torch.int32,
            )
            if N > 1
            else None
        )

        fn = functools.partial(
            chunk_gated_delta_rule,
            q,
            k,
            v,
            g,
            beta,
            initial_state=h0,
            output_final_state=True,
            use_qk_l2norm_in_kernel=True,
            state_v_first=True,
            cu_seqlens=cu,
        )

        t0 = time.time()
        fn()
        torch.cuda.synchronize()
        print(f"FLA prefill {name} first call {time.time() - t0:.1f} s", flush=True)
        eager = triton.testing.do_bench(fn, warmup=20, rep=200)
        ms, how = graph_bench(fn)
        res["prefill"][name] = {
            "ms": min(ms, eager),
            "graph_ms": ms if how == "graph" else None,
            "eager_ms": eager,
        }
        print(f"FLA prefill {name}: eager {eager:.3f} ms, {how} {ms:.3f} ms", flush=True)
    with open(out_path, "w") as fh:
        json.dump(res, fh, indent=1)


# --------------------------------------------------------------------------------------- table
def table(jax_path: str, fla_path: str) -> None:
    ours = json.load(open(jax_path))
    try:
        fla = json.load(open(fla_path))
    except OSError:
        fla = {"decode": {}, "prefill": {}}
    bw = ours["copy_TBps"]
    lines = [
        f"device {ours['device']}, copy bandwidth {bw:.2f} TB/s (read+write)",
        "| op | shape | ours | FLA 0.6.0 | FLA/ours | % of memory roofline (ours) | knobs |",
        "|---|---|---|---|---|---|---|",
    ]
    for B in (b for b in DECODE_B if str(b) in ours["decode"]):
        o, a = ours["decode"][str(B)], fla["decode"].get(str(B), {})
        au = a.get("us")
        lines.append(
            f"| gdn_state_update | B={B} | {o['us']:.1f} us | "
            f"{'-' if au is None else f'{au:.1f} us'} | "
            f"{'-' if au is None else f'{au / o["us"]:.2f}x'} | "
            f"{o['roofline_pct']:.0f}% | {o['knobs']} |"
        )
    for name in (n for n in PREFILL if n in ours["prefill"]):
        o, a = ours["prefill"][name], fla["prefill"].get(name, {})
        am = a.get("ms")
        lines.append(
            f"| gdn_chunk | {name} | {o['ms']:.3f} ms | "
            f"{'-' if am is None else f'{am:.3f} ms'} | "
            f"{'-' if am is None else f'{am / o["ms"]:.2f}x'} | "
            f"{o['roofline_pct']:.0f}% | {o['knobs']} |"
        )
    checks = {
        k: v
        for part in ("decode", "prefill")
        for k, v in ours[part].items()
        if k.startswith("check")
    }
    lines.append(f"intra kernel alone 1x8192: {ours['prefill'].get('intra_ms_1x8192')} ms")
    lines += [
        f"check {k}: o {v['rms_o']:.2e} state {v['rms_state']:.2e}" for k, v in checks.items()
    ]
    print("\n".join(lines))


# ------------------------------------------------------------------------------------- prefill
def prefill_part(out_path: str, budget_s: float = 150.0) -> None:
    """gdn_chunk only: accuracy of each precision variant vs the fp32 token recurrence (varlen and
    1x4096), a knob sweep at 1x8192 among the variants that pass 5e-3, the intra kernel alone,
    then 8x2048 and 1x32768 with the best knobs. Writes JSON in the `jax` part's format."""
    import functools

    import jax
    import jax.numpy as jnp
    import numpy as np

    from pallas_kernels import gdn_chunk as gc
    from pallas_kernels.gdn_reference import gdn_chunk_reference

    t_start = time.time()
    bf = jnp.bfloat16
    res: dict = {"device": str(jax.devices()[0].device_kind), "decode": {}, "prefill": {}}
    rng = np.random.default_rng(1)

    def rnd(*s_, dtype=bf):
        return jnp.asarray(rng.standard_normal(s_, np.float32)).astype(dtype)

    def rms_ratio(a, b):
        a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
        return float(np.sqrt(np.mean((a - b) ** 2)) / (np.sqrt(np.mean(b**2)) + 1e-30))

    def timed(f, x, reps=10):
        x = f(x)
        jax.block_until_ready(x)
        ts = []
        for _ in range(reps):
            t0 = time.perf_counter()
            x = f(x)
            jax.block_until_ready(x)
            ts.append(time.perf_counter() - t0)
        return float(np.median(ts))

    x = jnp.ones((256 * 1024 * 1024,), jnp.float32)
    t = timed(jax.jit(lambda x: jax.lax.fori_loop(0, 20, lambda i, y: y + 1.0, x)), x)
    res["copy_TBps"] = 2 * x.size * 4 * 20 / t / 1e12
    del x
    print(f"copy bandwidth {res['copy_TBps']:.2f} TB/s", flush=True)

    def inputs(lengths, nc=None, hi=True):
        T, R = sum(lengths), len(lengths)
        q, k, v = rnd(T, HK, D), rnd(T, HK, D), rnd(T, HV, D)
        g = jax.nn.log_sigmoid(rnd(T, HV, dtype=jnp.float32))
        beta = jax.nn.sigmoid(rnd(T, HV, dtype=jnp.float32))
        qsl = jnp.asarray(np.concatenate([[0], np.cumsum(lengths)]), jnp.int32)
        nc = jnp.zeros((R,), jnp.int32) if nc is None else jnp.asarray(nc, jnp.int32)
        rs = jnp.arange(1, R + 1, dtype=jnp.int32)
        return (q, k, v, g, beta), (qsl, nc, jnp.asarray(hi, bool) | jnp.zeros((R,), bool), rs, rs)

    variants = {
        "bf16 tiles, tf32 solve": dict(solve_dtype=jnp.float32),
        "bf16 tiles, bf16 solve": {},
    }
    lengths = (300, 1, 64, 129, 700, 33, 2, 500)
    nc = (0, 5, 64, 100, 3, 63, 0, 1000)
    hi = [False, True, True, True, False, True, True, True]
    cases = {"varlen": inputs(lengths, nc, hi), "1x4096": inputs((4096,))}
    ok = {}
    for cname, (ins, meta) in cases.items():
        R = meta[1].shape[0]
        st = rnd(R + 1, HV, D, D, dtype=jnp.float32) * 0.1
        st = st.at[0].set(jnp.nan)
        o2, s2 = jax.jit(gdn_chunk_reference)(*ins, st, *meta)
        for name, kn in variants.items():
            o1, s1 = jax.jit(functools.partial(gc.gdn_chunk, **kn))(*ins, st, *meta)
            chk = {
                "rms_o": rms_ratio(o1.astype(jnp.float32), o2.astype(jnp.float32)),
                "rms_state": rms_ratio(s1[1:], s2[1:]),
                "null_untouched": bool(jnp.isnan(s1[0]).all()),
                "finite": bool(jnp.isfinite(o1.astype(jnp.float32)).all()),
            }
            res["prefill"][f"check_{cname}: {name}"] = chk
            good = chk["rms_o"] <= 5e-3 and chk["rms_state"] <= 5e-3 and chk["null_untouched"]
            ok[name] = ok.get(name, True) and good and chk["finite"]
            print(f"check {cname} [{name}] {chk}", flush=True)
    passing = [n for n in variants if ok[n]] or ["bf16 tiles, tf32 solve"]  # last: the default

    def time_prefill(lengths, reps=10, **knobs):
        ins, meta = inputs(lengths)
        st = jnp.zeros((len(lengths) + 1, HV, D, D), jnp.float32)
        kern = functools.partial(gc.gdn_chunk, **knobs)
        f = jax.jit(
            lambda st: jax.lax.fori_loop(0, 4, lambda i, s_: kern(*ins, s_, *meta)[1], st),
            donate_argnums=0,
        )
        return timed(f, st, reps) / 4

    base = variants[passing[-1]] | dict(block_v=32)
    sweep = [base | dict(num_stages=ns, split_intra=sp) for sp in (False, True) for ns in (2, 3, 4)]
    sweep += [base | dict(num_stages=3, split_intra=sp, intra_num_warps=8) for sp in (False, True)]
    sweep += [base | dict(num_stages=3, block_v=64), variants[passing[0]] | dict(block_v=32)]
    best = None
    for kn in sweep:
        if time.time() - t_start > budget_s:
            print("sweep stopped: time budget", flush=True)
            break
        try:
            t = time_prefill(PREFILL["1x8192"], **kn)
        except Exception as e:  # a config that fails to compile is skipped, and said so
            print("prefill config failed", kn, repr(e)[:300], flush=True)
            continue
        print(f"prefill 1x8192 {kn} {t * 1e3:.3f} ms", flush=True)
        res["prefill"].setdefault("sweep_1x8192", []).append([str(kn), t * 1e3])
        if best is None or t < best[0]:
            best = (t, kn)
    kn = best[1]
    ins, meta = inputs(PREFILL["1x8192"])
    T = sum(PREFILL["1x8192"])
    cstart, clen, _, _ = gc.chunk_tiles(meta[0], meta[1], T, 64)
    intra = functools.partial(
        gc._intra_call,
        HV=HV,
        C=64,
        inter=jnp.dtype(kn.get("inter_dtype", bf)),
        warps=kn.get("intra_num_warps", 4),
        split=kn.get("split_intra", False),
        interpret=False,
        blk=kn.get("solve_block", 16),
        l2=True,
        scale=D**-0.5,
        prec=None,
        sdt=jnp.dtype(kn.get("solve_dtype", bf)),
        refine=kn.get("solve_refine", False),
    )

    def intra_loop(acc):
        def body(i, acc):  # acc * 0 chains the calls so they are not merged away
            t = intra(*ins[:3], ins[3] + acc * 0.0, ins[4], cstart, clen)  # both launches used
            return acc + t[0][0, 0, 0, 0] + t[-1][0, 0, 0, 0]

        return jax.lax.fori_loop(0, 4, body, acc)

    t_intra = timed(jax.jit(intra_loop), jnp.zeros((), jnp.float32), reps=20) / 4
    res["prefill"]["intra_ms_1x8192"] = t_intra * 1e3
    print(f"intra kernel alone 1x8192: {t_intra * 1e3:.3f} ms", flush=True)
    for name, lens in PREFILL.items():
        t = best[0] if name == "1x8192" else time_prefill(lens, **kn)
        res["prefill"][name] = {
            "ms": t * 1e3,
            "knobs": str(kn),
            "roofline_pct": 100 * prefill_min_bytes(lens) / (res["copy_TBps"] * 1e12) / t,
        }
        print(f"prefill {name} {kn} {t * 1e3:.3f} ms", flush=True)
    with open(out_path, "w") as fh:
        json.dump(res, fh, indent=1, default=str)


if __name__ == "__main__":
    part = sys.argv[1]
    if part == "jax":
        jax_part(sys.argv[2])
    elif part == "fla":
        fla_part(sys.argv[2], sys.argv[3] if len(sys.argv) > 3 else "")
    elif part == "prefill":
        prefill_part(sys.argv[2])
    else:
        table(sys.argv[2], sys.argv[3])
