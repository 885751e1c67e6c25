"""Mamba2 decode kernels on the GPU: check each against its reference, time it beside its anchor.
(The prefill kernels, SSD chunk scan and conv prefill, are in `bench_prefill.py`, which imports
this file's timing helpers.)

Run on the device machine (see benchmarks/RESULTS.md for the command). Anchors, in the same
process: mamba_ssm 2.3.2.post1 Triton `selective_state_update` (imported from its source tree
without the package __init__, which needs the CUDA extension) and FLA (fla-core 0.6.0)
`causal_conv1d_update`. Shapes: 128 heads, head dim 64, state 128, 8 groups; decode B = 1, 16, 64,
256; conv D = 8192, W = 4.

JAX side: jitted calls after a warm-up, median of many; each timed call runs `inner` kernel calls in
one unrolled loop (so JAX's ~40 us dispatch is amortised) and rotates state slots so the state
comes from DRAM, not L2; the host's round trip of a timing cancels (`device_seconds`). Anchors:
triton.testing.do_bench medians (L2 flushed between reps), decode kernels replayed from a CUDA
graph.
"""

from __future__ import annotations

# ruff: noqa: B023  (loop closures are used within their own iteration)
import functools
import json
import os
import statistics
import sys
import time
import traceback
import types

os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

from pallas_kernels.conv import update as conv  # noqa: E402
from pallas_kernels.ssd import reference as ssd_ref  # noqa: E402
from pallas_kernels.ssd import state_update as ssu  # noqa: E402

H, P, N, G, W, D_CONV = 128, 64, 128, 8, 4, 8192
BF, F32, I32 = jnp.bfloat16, jnp.float32, jnp.int32
OUT = os.environ.get("OUT", ".")
RESULTS: list[dict] = []
BW = {"tb_s": None}


def log(*a) -> None:
    print(*a, flush=True)


def record(**row) -> None:
    RESULTS.append(row)
    log("RESULT", json.dumps(row))


def rel_err(a, b) -> float:
    a, b = np.asarray(a, np.float32), np.asarray(b, np.float32)
    return float(np.sqrt(np.mean((a - b) ** 2)) / (np.sqrt(np.mean(b**2)) + 1e-12))


def unrolled(step, calls: int, carry, inputs=()):
    """`calls` calls of `step(i, state, inputs) -> (y, state)` in a row, i a Python int; the
    carry is (state, sum of a scalar of every y)."""
    state, acc = carry
    for i in range(calls):
        y, state = step(i, state, inputs)
        acc = acc + y.reshape(-1)[0].astype(F32)
    return state, acc


def input_sets(arrays: tuple[jax.Array, ...], count: int) -> list[tuple[jax.Array, ...]]:
    """`arrays` and `count - 1` copies of them in their own buffers: the `inputs` of a
    `time_loop` whose call i reads set i % count.

    XLA merges calls of one program that read the same values and do not depend on the carried
    state (CSE), and it sees the values of arrays a step closes over (they are lowered as
    constants). In issue 14's first timings the SSD chunk-state and C B^T kernels and the GDN
    intra kernel ran once per loop of calls, not once per call, that way.
    """
    return [arrays] + [tuple(jnp.copy(a) for a in arrays) for _ in range(count - 1)]


def time_loop(step, pool, inner: int, reps: int = 15, inputs=()) -> float:
    """Median microseconds per call of `step(i, pool, inputs) -> (y, pool)`.

    One jitted, fully unrolled loop of `inner` calls; `step` gets its call's index as a Python
    int and `inputs` as arguments of the loop (see `input_sets`). A scalar of every y is summed
    into the carry so no kernel can be dead-code eliminated. Each timing is `device_seconds` of
    the loop.
    """
    loop = jax.jit(functools.partial(unrolled, step, inner), donate_argnums=0)
    carry = (pool, jnp.zeros((), F32))
    return device_seconds(lambda c: loop(c, inputs), carry, reps) / inner * 1e6


def device_seconds(step, state, reps: int, chain: int = 5) -> float:
    """Median seconds of one `state = step(state)` on the device, host round trip excluded (one
    untimed call first compiles and warms it).

    A timing that dispatches one call and waits for it also pays the host's side of the round
    trip: a traced H200 run showed 0.55-0.64 ms of idle GPU between one timed loop's last kernel
    and the next loop's first, a fifth of a loop of eight 0.28 ms kernels (RESULTS.md, "Timing
    harness"). So each timing runs `chain` calls back to back (each dispatched while the one
    before runs) and once alone, and takes the difference over `chain - 1`: the round trip
    cancels.
    """
    state = jax.block_until_ready(step(state))

    def timed(calls: int) -> float:
        nonlocal state
        t0 = time.perf_counter()
        for _ in range(calls):
            state = step(state)
        jax.block_until_ready(state)
        return time.perf_counter() - t0

    return statistics.median((timed(chain) - timed(1)) / (chain - 1) for _ in range(reps))


def copy_bandwidth() -> float:
    """Read + write TB/s of a jitted `a + 1` over 1 GiB of fp32, the host's round trip excluded
    (`device_seconds`). (Run 2 fused 20 unrolled multiplies into one pass and reported 47.9 TB/s;
    separate jitted calls cannot be fused.)"""
    add = jax.jit(lambda a: a + 1.0, donate_argnums=0)
    x = jnp.ones((256 * 1024 * 1024,), F32)
    nbytes = 2 * x.nbytes
    return nbytes / device_seconds(add, x, reps=20, chain=10) / 1e12


def pct_roofline(nbytes: float, us: float) -> float:
    return 100.0 * nbytes / (us * 1e-6) / (BW["tb_s"] * 1e12)


# ----------------------------------------------------------------------------- anchors (torch)


def import_anchors():
    import torch
    import triton

    src = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".whl_mamba", "src")
    pkg = types.ModuleType("mamba_ssm")
    pkg.__path__ = [os.path.join(src, "mamba_ssm")]
    sys.modules["mamba_ssm"] = pkg  # skip mamba_ssm/__init__ (it imports the CUDA extension)
    from mamba_ssm.ops.triton.selective_state_update import selective_state_update
    from mamba_ssm.ops.triton.ssd_combined import mamba_chunk_scan_combined

    return torch, triton, selective_state_update, mamba_chunk_scan_combined


def bench_graph(torch, triton, fn) -> float:
    """Median microseconds of fn replayed from a CUDA graph (L2 flushed by do_bench)."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    return triton.testing.do_bench(graph.replay, warmup=50, rep=300, return_mode="median") * 1e3


def bench_eager(triton, fn) -> float:
    return triton.testing.do_bench(fn, warmup=25, rep=200, return_mode="median") * 1e3


# ----------------------------------------------------------------------------- decode: SSU


def ssu_inputs(rng, batch):
    f = lambda *s: rng.standard_normal(s, np.float32)  # noqa: E731
    return dict(
        x=f(batch, 1, H, P),
        dt=f(batch, 1, H) - 2.0,
        A=-np.exp(f(H) * 0.5),
        B=f(batch, 1, G, N),
        C=f(batch, 1, G, N),
        D=f(H),
        z=f(batch, 1, H, P),
        dt_bias=f(H) * 0.5,
    )


def jax_ssu_args(d):
    cast = {"x": BF, "dt": BF, "B": BF, "C": BF, "z": BF}
    return {k: jnp.asarray(v, cast.get(k, F32)) for k, v in d.items()}


def bench_ssu(anchors, configs):
    torch, triton, sel_update, _ = anchors
    rng = np.random.default_rng(0)
    slot_bytes = H * P * N * 4
    for batch in (1, 16, 64, 256):
        d = ssu_inputs(rng, batch)
        a = jax_ssu_args(d)
        sets = max(2, -(-512 * 2**20 // (batch * slot_bytes)))  # >= 512 MiB of distinct slots
        slots = 1 + jnp.arange(sets * batch, dtype=I32).reshape(sets, batch)
        pool = jax.random.normal(jax.random.key(1), (sets * batch + 1, H, P, N), F32)
        # Correctness: kernel vs reference on one call (fresh copies of the pool).
        kw = dict(D=a["D"], z=a["z"], dt_bias=a["dt_bias"])
        args = (a["x"], a["dt"], a["A"], a["B"], a["C"])
        y_ref, p_ref = ssd_ref.ssd_state_update_reference(
            *args, pool, slots[0], slots[0][:, None], **kw
        )
        y, p = ssu.ssd_state_update(*args, jnp.copy(pool), slots[0], slots[0][:, None], **kw)
        err_y, err_s = rel_err(y, y_ref), rel_err(p[slots[0]], p_ref[slots[0]])
        del p_ref, p
        best = None
        for cfg in configs:
            try:

                def step(i, pool, _inputs, cfg=cfg):
                    sl = jax.lax.dynamic_index_in_dim(slots, i % sets, keepdims=False)
                    return ssu.ssd_state_update(*args, pool, sl, sl[:, None], **kw, **cfg)

                us = time_loop(step, pool, inner=100 if batch <= 16 else 20)
                pool = jax.random.normal(jax.random.key(1), pool.shape, F32)  # donated above
                log(f"ssu B={batch} {cfg}: {us:.1f} us")
                if best is None or us < best[0]:
                    best = (us, cfg)
            except Exception as e:  # noqa: BLE001
                log(f"ssu B={batch} {cfg} FAILED: {e!r}"[:400])
        # Anchor: mamba_ssm selective_state_update on the same shapes (tie_hdim broadcasting).
        t = lambda k, dt=torch.bfloat16: torch.from_numpy(d[k]).cuda().to(dt)  # noqa: E731
        state = torch.randn(batch + 1, H, P, N, device="cuda", dtype=torch.float32)
        xx, zz = t("x")[:, 0], t("z")[:, 0]
        dtt = t("dt")[:, 0][:, :, None].expand(batch, H, P)
        aa = t("A", torch.float32)[:, None, None].expand(H, P, N)
        dd = t("D", torch.float32)[:, None].expand(H, P)
        bias = t("dt_bias", torch.float32)[:, None].expand(H, P)
        bb, cc = t("B")[:, 0], t("C")[:, 0]
        idx = torch.arange(1, batch + 1, device="cuda", dtype=torch.int32)
        state[1:] = torch.from_numpy(np.array(pool[1 : batch + 1])).cuda() if batch <= 64 else 0
        call = functools.partial(
            sel_update,
            state,
            xx,
            dtt,
            aa,
            bb,
            cc,
            D=dd,
            z=zz,
            dt_bias=bias,
            dt_softplus=True,
            state_batch_indices=idx,
        )
        y_anchor = call()
        anchor_us = bench_graph(torch, triton, call)
        cross = None
        if batch <= 64:  # same inputs and initial state: compare outputs with the anchor
            y1, _ = ssu.ssd_state_update(*args, jnp.copy(pool), slots[0], slots[0][:, None], **kw)
            cross = rel_err(np.asarray(y1[:, 0], np.float32), y_anchor.float().cpu().numpy())
        nbytes = 2 * batch * slot_bytes + batch * H * P * 2 * 3
        record(
            op="ssd_state_update",
            shape=f"B={batch} H{H} P{P} N{N} G{G}",
            ours_us=best[0],
            anchor="mamba_ssm selective_state_update",
            anchor_us=anchor_us,
            ratio=anchor_us / best[0],
            pct_roofline=pct_roofline(nbytes, best[0]),
            config=best[1],
            err_vs_ref_y=err_y,
            err_vs_ref_state=err_s,
            err_vs_anchor_y=cross,
        )
        del pool, state


# ----------------------------------------------------------------------------- conv1d update


def bench_conv_update(anchors, configs):
    torch, triton = anchors[0], anchors[1]
    from fla.modules.causal_conv1d import causal_conv1d_update as fla_update

    rng = np.random.default_rng(2)
    wt = rng.standard_normal((D_CONV, W), np.float32) * 0.5
    bs = rng.standard_normal(D_CONV, np.float32)
    w_j, b_j = jnp.asarray(wt, BF), jnp.asarray(bs, BF)
    w_t, b_t = torch.from_numpy(wt).cuda().bfloat16(), torch.from_numpy(bs).cuda().bfloat16()
    for batch in (1, 64, 256):
        xn = rng.standard_normal((batch, 1, D_CONV), np.float32)
        x = jnp.asarray(xn, BF)
        sets = max(2, -(-256 * 2**20 // (batch * D_CONV * (W - 1) * 2)))
        slots = 1 + jnp.arange(sets * batch, dtype=I32).reshape(sets, batch)
        state = jnp.zeros((sets * batch + 1, D_CONV, W - 1), BF)

        def step(i, st, _inputs):
            sl = jax.lax.dynamic_index_in_dim(slots, i % sets, keepdims=False)
            return conv.causal_conv1d_update(x, w_j, b_j, st, sl, sl[:, None])

        us = time_loop(step, state, inner=100)
        cache = torch.zeros(batch, D_CONV, W, device="cuda", dtype=torch.bfloat16)
        xt = torch.from_numpy(xn).cuda().bfloat16()
        try:
            call = functools.partial(fla_update, xt, cache, weight=w_t, bias=b_t, activation="silu")
            anchor_us = bench_graph(torch, triton, call)
        except Exception as e:  # noqa: BLE001
            log(f"FLA causal_conv1d_update FAILED: {e!r}"[:400])
            anchor_us = float("nan")
        nbytes = batch * D_CONV * (2 * (W - 1) + 2) * 2
        record(
            op="causal_conv1d_update",
            shape=f"B={batch} D{D_CONV} W{W}",
            ours_us=us,
            anchor="FLA causal_conv1d_update",
            anchor_us=anchor_us,
            ratio=anchor_us / us,
            pct_roofline=pct_roofline(nbytes, us),
            config={},
        )


def main() -> None:
    log("devices", jax.devices())
    BW["tb_s"] = copy_bandwidth()
    log(f"copy bandwidth (read + write): {BW['tb_s']:.2f} TB/s")
    anchors = import_anchors()
    sections = [
        (
            bench_ssu,
            [dict(block_p=bp, num_warps=w) for bp, w in ((16, 4), (32, 4), (32, 8), (64, 8))],
        ),
        (bench_conv_update, [{}]),
    ]
    only = os.environ.get("BENCH_ONLY")  # e.g. "conv": those sections, in that order
    if only:
        sections = [sec for o in only.split(",") for sec in sections if o in sec[0].__name__]
    for fn, configs in sections:
        try:
            fn(anchors, configs)
        except Exception:  # noqa: BLE001
            log(f"{fn.__name__} FAILED\n{traceback.format_exc()}")
        with open(os.path.join(OUT, "results.json"), "w") as fh:
            json.dump({"bandwidth_tb_s": BW["tb_s"], "results": RESULTS}, fh, indent=1, default=str)
    log("\nop | shape | ours us | anchor us | ratio | % roofline | err vs ref | err vs anchor")
    for r in RESULTS:
        log(
            f"{r['op']} | {r['shape']} | {r['ours_us']:.1f} | {r['anchor_us']:.1f} | "
            f"{r['ratio']:.2f} | {r['pct_roofline']:.0f}% | {r.get('err_vs_ref_y')} | "
            f"{r.get('err_vs_anchor_y')} | {r['config']}"
        )


if __name__ == "__main__":
    main()
